package acl_test

import (
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil/testcert"
	"github.com/runnel-dev/runnel/transport/acl"
	"github.com/runnel-dev/runnel/transport/namesrv"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

func TestTLSModes(t *testing.T) {
	for s, want := range map[string]acl.TLSMode{"disabled": acl.TLSDisabled, "Permissive": acl.TLSPermissive, " enforcing ": acl.TLSEnforcing} {
		got, err := acl.ParseTLSMode(s)
		if err != nil || got != want {
			t.Errorf("ParseTLSMode(%q) = %v, %v", s, got, err)
		}
	}
	for _, s := range []string{"", "on", "enforce", "strict"} {
		if _, err := acl.ParseTLSMode(s); err == nil || !strings.Contains(err.Error(), "want disabled, permissive or enforcing") {
			t.Errorf("ParseTLSMode(%q) = %v", s, err)
		}
	}
	for _, tc := range []struct {
		req  string
		acl  bool
		want acl.TLSMode
		err  bool
	}{
		{"", false, acl.TLSDisabled, false},
		{"", true, acl.TLSEnforcing, false}, // ACL implies enforcing…
		{"disabled", true, acl.TLSDisabled, false},
		{"permissive", true, acl.TLSPermissive, false}, // …unless explicitly overridden
		{"bogus", true, 0, true},
	} {
		got, err := acl.ResolveTLSMode(tc.req, tc.acl)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("ResolveTLSMode(%q, %v) = %v, %v", tc.req, tc.acl, got, err)
		}
	}
	if _, err := acl.TLSServerOptions(acl.TLSEnforcing, nil); err == nil {
		t.Error("enforcing without a config accepted")
	}
	if _, err := namesrv.New(namesrv.WithListenAddr("127.0.0.1:0"), namesrv.WithTLS(acl.TLSPermissive, nil)); err == nil {
		t.Error("namesrv accepted permissive TLS without a certificate")
	}
}

func TestServerTLSConfigErrors(t *testing.T) {
	dir := t.TempDir()
	c := testcert.New(t, "srv").WriteFiles(t, dir)
	junk := filepath.Join(dir, "junk.pem")
	if err := os.WriteFile(junk, []byte("not pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name          string
		cert, key, ca string
		want          string
	}{
		{"no key", c.Cert, "", "", "both a certificate file and a key file"},
		{"missing cert", filepath.Join(dir, "none.pem"), c.Key, "", "loading TLS certificate"},
		{"key mismatch", c.CA, c.Key, "", "loading TLS certificate"},
		{"missing CA", c.Cert, c.Key, filepath.Join(dir, "none.pem"), "client CA file"},
		{"junk CA", c.Cert, c.Key, junk, "holds no PEM certificate"},
	} {
		if _, err := acl.ServerTLSConfig(tc.cert, tc.key, tc.ca); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

// TestTLSPortModes runs the name server in each mode and checks which
// clients get an answer: plain, TLS, and TLS with and without a client
// certificate when a client CA is configured.
func TestTLSPortModes(t *testing.T) {
	dir := t.TempDir()
	srv := testcert.New(t, "server")
	srvFiles := srv.WriteFiles(t, dir)
	cli := testcert.New(t, "client") // its CA becomes the client CA
	plainTLS, err := acl.ServerTLSConfig(srvFiles.Cert, srvFiles.Key, "")
	if err != nil {
		t.Fatal(err)
	}
	mutualTLS, err := acl.ServerTLSConfig(srvFiles.Cert, srvFiles.Key, cli.WriteFiles(t, dir).CA)
	if err != nil {
		t.Fatal(err)
	}
	withCert := srv.ClientTLS()
	withCert.Certificates = []tls.Certificate{cli.Certificate}

	type client struct {
		name string
		cfg  *tls.Config
	}
	plain, tlsNoCert, tlsCert := client{"plain", nil}, client{"tls", srv.ClientTLS()}, client{"tls+cert", withCert}
	for _, tc := range []struct {
		name    string
		mode    acl.TLSMode
		cfg     *tls.Config
		ok, bad []client
	}{
		{"disabled", acl.TLSDisabled, plainTLS, []client{plain}, []client{tlsNoCert}},
		{"permissive", acl.TLSPermissive, plainTLS, []client{plain, tlsNoCert}, nil},
		{"enforcing", acl.TLSEnforcing, plainTLS, []client{tlsNoCert, tlsCert}, []client{plain}},
		{"enforcing mutual", acl.TLSEnforcing, mutualTLS, []client{tlsCert}, []client{plain, tlsNoCert}},
		{"permissive mutual", acl.TLSPermissive, mutualTLS, []client{plain, tlsCert}, []client{tlsNoCert}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns, err := namesrv.New(namesrv.WithListenAddr("127.0.0.1:0"), namesrv.WithTLS(tc.mode, tc.cfg),
				namesrv.WithRemotingOptions(remoting.WithIdleTimeout(2*time.Second)))
			if err != nil {
				t.Fatal(err)
			}
			if err := ns.Start(ctxT(t, 5*time.Second)); err != nil {
				t.Fatal(err)
			}
			defer ns.Close()
			for _, c := range tc.ok {
				if err := tryCluster(t, ns.Addr(), c.cfg); err != nil {
					t.Errorf("%s client refused: %v", c.name, err)
				}
			}
			for _, c := range tc.bad {
				if err := tryCluster(t, ns.Addr(), c.cfg); err == nil {
					t.Errorf("%s client served", c.name)
				}
			}
		})
	}
}

// tryCluster dials addr and asks for the cluster info; any failure to get
// an answer is returned.
func tryCluster(t *testing.T, addr string, cfg *tls.Config) error {
	ctx := ctxT(t, 3*time.Second)
	var opts []remoting.Option
	if cfg != nil {
		opts = append(opts, remoting.WithTLSConfig(cfg))
	}
	c, err := remoting.Dial(ctx, addr, append(opts, remoting.WithIdleTimeout(2*time.Second))...)
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Invoke(ctx, protocol.NewRequest(protocol.ReqGetBrokerClusterInfo))
	return err
}

var benchRemote = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}

// BenchmarkCheckSend is the per-request cost of the policy on a signed
// SEND_MESSAGE_V2 with a 1 KiB body: signature verification and the topic
// check.
func BenchmarkCheckSend(b *testing.B) {
	p, err := acl.NewPolicy(testConfig())
	if err != nil {
		b.Fatal(err)
	}
	cmd := protocol.NewRequest(protocol.ReqSendMessageV2)
	h := protocol.SendMessageRequestHeaderV2{ProducerGroup: "PG", Topic: topicT, DefaultTopic: "TBW102", DefaultTopicQueueNums: 4,
		QueueID: 1, BornTimestamp: 1700000000000, Properties: "UNIQ_KEY\x010A000005000000000000000000000001\x02"}
	h.Encode(cmd)
	cmd.Body = make([]byte, 1024)
	acl.Sign(cmd, acl.Credentials{AccessKey: "pub-only", SecretKey: "pub-secret"})
	if err := p.Check(cmd, benchRemote); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := p.Check(cmd, benchRemote); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckPull is the same for a signed PULL_MESSAGE (no body; topic
// and group checks).
func BenchmarkCheckPull(b *testing.B) {
	p, err := acl.NewPolicy(testConfig())
	if err != nil {
		b.Fatal(err)
	}
	cmd := protocol.NewRequest(protocol.ReqPullMessage)
	h := protocol.PullMessageRequestHeader{ConsumerGroup: groupG, Topic: topicT, QueueID: 1, QueueOffset: 12345,
		MaxMsgNums: 32, SysFlag: 3, CommitOffset: 12000, SuspendTimeoutMillis: 20000, SubVersion: 1700000000000000000}
	h.Encode(cmd)
	acl.Sign(cmd, acl.Credentials{AccessKey: "sub-only", SecretKey: "sub-secret"})
	b.ReportAllocs()
	for b.Loop() {
		if err := p.Check(cmd, benchRemote); err != nil {
			b.Fatal(err)
		}
	}
}
