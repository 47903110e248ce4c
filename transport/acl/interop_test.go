package acl_test

import (
	"errors"
	"hash/crc32"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/acl"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// TestClientCredentialsAgainstNamesrv cross-checks transport/client's
// signer (WithCredentials) with this package's verifier over TLS: a broker
// registers with admin credentials signed by acl.Sign, then the runnel
// client reads the route with an ordinary account; with a wrong secret or
// no credentials it gets NO_PERMISSION.
func TestClientCredentialsAgainstNamesrv(t *testing.T) {
	p, err := acl.NewPolicy(testConfig())
	if err != nil {
		t.Fatal(err)
	}
	srvTLS, certs := serverCert(t, "ns")
	addr := newNamesrv(t, p, acl.TLSEnforcing, srvTLS)

	// What runnel's broker must do: sign REGISTER_BROKER with an admin account.
	conn := dial(t, addr, certs.ClientTLS())
	reg := registerRequest(t)
	unsigned := registerRequest(t)
	acl.Sign(reg, acl.Credentials{AccessKey: "admin-ak", SecretKey: "admin-secret"})
	for _, tc := range []struct {
		name string
		req  *protocol.Command
		want int32
	}{{"unsigned", unsigned, protocol.ResNoPermission}, {"admin-signed", reg, protocol.ResSuccess}} {
		resp, err := conn.Invoke(ctxT(t, 5*time.Second), tc.req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Code != tc.want {
			t.Fatalf("%s REGISTER_BROKER: code %d %q, want %d", tc.name, resp.Code, resp.Remark, tc.want)
		}
	}

	for _, tc := range []struct {
		name     string
		creds    *client.Credentials
		wantDeny bool
	}{
		{"user", &client.Credentials{AccessKey: "user-ak", SecretKey: "user-secret"}, false},
		{"user with token", &client.Credentials{AccessKey: "sub-only", SecretKey: "sub-secret", SecurityToken: "tok"}, false},
		{"wrong secret", &client.Credentials{AccessKey: "user-ak", SecretKey: "nope-nope"}, true},
		{"none", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := []client.Option{client.WithNameServers(addr), client.WithTLSConfig(certs.ClientTLS())}
			if tc.creds != nil {
				opts = append(opts, client.WithCredentials(*tc.creds))
			}
			cl, err := client.New(opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			route, err := cl.Route(ctxT(t, 10*time.Second), topicT)
			if tc.wantDeny {
				var pe *protocol.Error
				if !errors.As(err, &pe) || pe.Code != protocol.ResNoPermission || !strings.HasPrefix(pe.Remark, "acl: ") {
					t.Fatalf("Route = %v, %v; want an ACL NO_PERMISSION", route, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Route: %v", err)
			}
			if route == nil {
				t.Fatal("nil route")
			}
		})
	}
}

// registerRequest builds a first REGISTER_BROKER of broker "b1" with two
// topics (a first registration with exactly one is refused, as in Java).
func registerRequest(t *testing.T) *protocol.Command {
	t.Helper()
	tc := func(name string) protocol.TopicConfig {
		return protocol.TopicConfig{TopicName: name, ReadQueueNums: 4, WriteQueueNums: 4, Perm: 6, TopicFilterType: "SINGLE_TAG"}
	}
	body := protocol.RegisterBrokerBody{TopicConfigSerializeWrapper: protocol.TopicConfigSerializeWrapper{
		TopicConfigTable: map[string]protocol.TopicConfig{topicT: tc(topicT), "TBW102": tc("TBW102")}}}
	raw, err := body.Encode()
	if err != nil {
		t.Fatal(err)
	}
	req := protocol.NewRequest(protocol.ReqRegisterBroker)
	(&protocol.RegisterBrokerRequestHeader{BrokerName: "b1", BrokerAddr: "127.0.0.1:10911", ClusterName: "c1",
		HAServerAddr: "127.0.0.1:10912", Compressed: protocol.Some(false),
		BodyCRC32: protocol.Some(int32(crc32.ChecksumIEEE(raw) & 0x7FFFFFFF))}).Encode(req)
	req.Body = raw
	return req
}
