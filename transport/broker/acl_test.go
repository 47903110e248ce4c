package broker

import (
	"bytes"
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil/testcert"
	"github.com/runnel-dev/runnel/transport/acl"
	"github.com/runnel-dev/runnel/transport/namesrv"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// The vocabulary of package acl's matrix test, reused for the broker: the
// same accounts, identities and classes, on resources aclTopic/aclGroup.
const (
	aclTopic = "T"
	aclGroup = "G"
)

func aclBrokerConfig() *acl.Config {
	return &acl.Config{Accounts: []acl.Account{
		{AccessKey: "admin-ak", SecretKey: "admin-secret", Admin: true},
		{AccessKey: "user-ak", SecretKey: "user-secret", DefaultTopicPerm: "PUB|SUB", DefaultGroupPerm: "SUB"},
		{AccessKey: "pub-only", SecretKey: "pub-secret", DefaultTopicPerm: "PUB", DefaultGroupPerm: "DENY"},
		{AccessKey: "sub-only", SecretKey: "sub-secret", DefaultTopicPerm: "DENY", DefaultGroupPerm: "DENY",
			TopicPerms: map[string]string{aclTopic: "SUB"}, GroupPerms: map[string]string{aclGroup: "SUB"}},
		{AccessKey: "deny-ak", SecretKey: "deny-secret", DefaultTopicPerm: "PUB|SUB", DefaultGroupPerm: "SUB",
			TopicPerms: map[string]string{aclTopic: "DENY"}, GroupPerms: map[string]string{aclGroup: "DENY"}},
	}}
}

var aclAdmin = acl.Credentials{AccessKey: "admin-ak", SecretKey: "admin-secret"}

// aclIdentity is one way of (not) signing a request.
type aclIdentity struct {
	name string
	sign func(cmd *protocol.Command)
}

func aclSignAs(ak, sk string) func(*protocol.Command) {
	return func(cmd *protocol.Command) { acl.Sign(cmd, acl.Credentials{AccessKey: ak, SecretKey: sk}) }
}

var aclIdentities = []aclIdentity{
	{"no-credentials", func(*protocol.Command) {}},
	{"bad-signature", aclSignAs("user-ak", "not-the-secret")},
	{"altered-body", func(cmd *protocol.Command) {
		aclSignAs("user-ak", "user-secret")(cmd)
		cmd.Body = append(bytes.Clone(cmd.Body), ' ')
	}},
	{"non-admin", aclSignAs("user-ak", "user-secret")},
	{"pub-only", aclSignAs("pub-only", "pub-secret")},
	{"sub-only", aclSignAs("sub-only", "sub-secret")},
	{"deny", aclSignAs("deny-ak", "deny-secret")},
	{"admin", aclSignAs("admin-ak", "admin-secret")},
}

// aclClasses list, per class, the identities allowed; the others must be
// denied. Written from aclBrokerConfig, not from the implementation.
var aclClasses = map[string][]string{
	"never": {},
	"admin": {"admin"},
	"auth":  {"non-admin", "pub-only", "sub-only", "deny", "admin"},
	"pub":   {"non-admin", "pub-only", "admin"},
	"sub":   {"non-admin", "sub-only", "admin"},
}

// aclCase is a real broker request, its class and, when allowed, the code
// the broker's processor must answer (-1: any, as long as ACL let it by).
type aclCase struct {
	name   string
	class  string
	wantOK int32
	req    func() *protocol.Command
}

const aclConsumerHeartbeat = `{"clientID":"c1","consumerDataSet":[{"groupName":"G","consumeType":"CONSUME_PASSIVELY",` +
	`"messageModel":"CLUSTERING","consumeFromWhere":"CONSUME_FROM_LAST_OFFSET","unitMode":false,` +
	`"subscriptionDataSet":[{"topic":"T","subString":"*","tagsSet":[],"codeSet":[],"subVersion":1,"expressionType":"TAG"}]}],"producerDataSet":[]}`

var aclBrokerCases = []aclCase{
	{"SEND_MESSAGE", "pub", protocol.ResSuccess, func() *protocol.Command {
		return sendReq(aclTopic, 0, []byte("hello"), "")
	}},
	{"SEND_MESSAGE to retry topic", "sub", -1, func() *protocol.Command {
		return sendReq("%RETRY%"+aclGroup, 0, []byte("hello"), "")
	}},
	{"PULL_MESSAGE", "sub", -1, func() *protocol.Command {
		return pullRequest(pullArgs{group: aclGroup, topic: aclTopic, max: 4})
	}},
	{"QUERY_CONSUMER_OFFSET", "sub", -1, func() *protocol.Command {
		req := protocol.NewRequest(protocol.ReqQueryConsumerOffset)
		(&protocol.QueryConsumerOffsetRequestHeader{ConsumerGroup: aclGroup, Topic: aclTopic}).Encode(req)
		return req
	}},
	{"UPDATE_CONSUMER_OFFSET", "sub", protocol.ResSuccess, func() *protocol.Command {
		req := protocol.NewRequest(protocol.ReqUpdateConsumerOffset)
		(&protocol.UpdateConsumerOffsetRequestHeader{ConsumerGroup: aclGroup, Topic: aclTopic, CommitOffset: 0}).Encode(req)
		return req
	}},
	{"GET_MAX_OFFSET", "sub", protocol.ResSuccess, func() *protocol.Command {
		req := protocol.NewRequest(protocol.ReqGetMaxOffset)
		(&protocol.GetMaxOffsetRequestHeader{Topic: aclTopic}).Encode(req)
		return req
	}},
	{"HEART_BEAT consumer", "sub", protocol.ResSuccess, func() *protocol.Command {
		req := protocol.NewRequest(protocol.ReqHeartbeat)
		req.Body = []byte(aclConsumerHeartbeat)
		return req
	}},
	{"HEART_BEAT producer", "auth", protocol.ResSuccess, func() *protocol.Command {
		req := protocol.NewRequest(protocol.ReqHeartbeat)
		req.Body = []byte(`{"clientID":"c1","consumerDataSet":[],"producerDataSet":[{"groupName":"PG"}]}`)
		return req
	}},
	{"UPDATE_AND_CREATE_TOPIC", "admin", protocol.ResSuccess, func() *protocol.Command {
		return aclCreateTopic("Created")
	}},
	{"GET_ALL_TOPIC_CONFIG", "admin", protocol.ResSuccess, func() *protocol.Command {
		return protocol.NewRequest(protocol.ReqGetAllTopicConfig)
	}},
	{"UPDATE_BROKER_CONFIG path", "admin", protocol.ResNoPermission, func() *protocol.Command {
		req := protocol.NewRequest(25)
		req.Body = []byte("brokerConfigPath=/tmp/x")
		return req
	}},
	{"UPDATE_BROKER_CONFIG allowed key", "admin", protocol.ResSuccess, func() *protocol.Command {
		req := protocol.NewRequest(25)
		req.Body = []byte("maxTransferCountOnMessageInMemory=32")
		return req
	}},
	{"GET_BROKER_CONFIG", "admin", protocol.ResSuccess, func() *protocol.Command {
		return protocol.NewRequest(26)
	}},
	{"unknown code 9999", "never", -1, func() *protocol.Command {
		req := protocol.NewRequest(9999)
		req.SetExt("topic", aclTopic)
		return req
	}},
}

func aclCreateTopic(topic string) *protocol.Command {
	req := protocol.NewRequest(protocol.ReqUpdateAndCreateTopic)
	(&protocol.CreateTopicRequestHeader{Topic: topic, DefaultTopic: topicDefault, ReadQueueNums: 1, WriteQueueNums: 1,
		Perm: protocol.PermRead | protocol.PermWrite, TopicFilterType: "SINGLE_TAG"}).Encode(req)
	return req
}

func aclDial(t testing.TB, addr string, cfg *tls.Config) *remoting.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var opts []remoting.Option
	if cfg != nil {
		opts = append(opts, remoting.WithTLSConfig(cfg))
	}
	c, err := remoting.Dial(ctx, addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// startACLMatrixBroker starts a broker with the ACL of aclBrokerConfig
// (over enforcing TLS when useTLS), creates topic aclTopic as the admin,
// so that sends and offsets can succeed, and returns it, a connection to it
// and its policy.
func startACLMatrixBroker(t *testing.T, useTLS bool) (*Broker, *remoting.Conn, *acl.Policy) {
	t.Helper()
	p, err := acl.NewPolicy(aclBrokerConfig())
	if err != nil {
		t.Fatal(err)
	}
	opts := []Option{WithACL(p)}
	var clientTLS *tls.Config
	if useTLS {
		cert := testcert.New(t, "runnel broker test")
		clientTLS = cert.ClientTLS()
		opts = append(opts, WithTLS(acl.TLSEnforcing, cert.ServerTLS()))
	}
	b := startBroker(t, opts...)
	c := aclDial(t, b.Addr(), clientTLS)
	create := aclCreateTopic(aclTopic)
	acl.Sign(create, aclAdmin)
	if resp := invoke(t, c, create); resp.Code != protocol.ResSuccess {
		t.Fatalf("create %s: %d %s", aclTopic, resp.Code, resp.Remark)
	}
	return b, c, p
}

// TestBrokerACLMatrix runs every identity against representative broker
// request codes on a real broker with WithACL, over plain TCP and over
// enforcing TLS: a denied request gets NO_PERMISSION with an "acl: " remark,
// an allowed one reaches the broker's processor (and the documented success
// code where the request is complete enough to succeed).
func TestBrokerACLMatrix(t *testing.T) {
	for _, useTLS := range []bool{false, true} {
		name := "plain"
		if useTLS {
			name = "tls"
		}
		t.Run(name, func(t *testing.T) {
			b, c, p := startACLMatrixBroker(t, useTLS)
			for _, mc := range aclBrokerCases {
				allowed := map[string]bool{}
				for _, id := range aclClasses[mc.class] {
					allowed[id] = true
				}
				for _, id := range aclIdentities {
					req := mc.req()
					id.sign(req)
					resp := invoke(t, c, req)
					denied := resp.Code == protocol.ResNoPermission && strings.HasPrefix(resp.Remark, "acl: ")
					switch {
					case allowed[id.name] && denied:
						t.Errorf("%s as %s: denied (%s), want allowed", mc.name, id.name, resp.Remark)
					case allowed[id.name] && mc.wantOK >= 0 && resp.Code != mc.wantOK:
						t.Errorf("%s as %s: code %d %q, want %d", mc.name, id.name, resp.Code, resp.Remark, mc.wantOK)
					case !allowed[id.name] && !denied:
						t.Errorf("%s as %s: code %d %q, want NO_PERMISSION from acl", mc.name, id.name, resp.Code, resp.Remark)
					}
				}
			}
			if st := p.Stats(); st.Allowed == 0 || st.Denied == 0 {
				t.Fatalf("policy stats %+v", st)
			}
			if useTLS {
				// Plain TCP is refused on an enforcing port.
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				pc, err := remoting.Dial(ctx, b.Addr())
				if err != nil {
					t.Fatal(err)
				}
				defer pc.Close()
				req := sendReq(aclTopic, 0, []byte("x"), "")
				acl.Sign(req, aclAdmin)
				if _, err := pc.Invoke(ctx, req); err == nil {
					t.Fatal("plain request answered on an enforcing TLS port")
				}
			}
		})
	}
}

// TestBrokerRegistersWithSecuredNameServer: a broker registers with a
// name server enforcing ACL and TLS when given admin credentials and a TLS
// configuration, and unregisters (signed) at shutdown; without credentials
// its registration is refused.
func TestBrokerRegistersWithSecuredNameServer(t *testing.T) {
	nsPolicy, err := acl.NewPolicy(aclBrokerConfig())
	if err != nil {
		t.Fatal(err)
	}
	cert := testcert.New(t, "runnel name server test")
	clientTLS := cert.ClientTLS()
	ns, err := namesrv.New(namesrv.WithListenAddr("127.0.0.1:0"), namesrv.WithKVConfigDir(t.TempDir()),
		namesrv.WithACL(nsPolicy), namesrv.WithTLS(acl.TLSEnforcing, cert.ServerTLS()))
	if err != nil {
		t.Fatal(err)
	}
	if err := ns.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Close() })
	admin := aclDial(t, ns.Addr(), clientTLS)
	hasRoute := func(topic string) bool {
		req := protocol.NewRequest(protocol.ReqGetRouteInfoByTopic)
		req.SetExt("topic", topic)
		acl.Sign(req, aclAdmin)
		return invoke(t, admin, req).Code == protocol.ResSuccess
	}

	// Without credentials: refused (the broker keeps retrying in the background).
	denied0 := nsPolicy.Stats().Denied
	startBroker(t, WithBrokerName("unsigned"), WithNameServers(ns.Addr()), WithNameServerTLS(clientTLS))
	if d := nsPolicy.Stats().Denied; d == denied0 {
		t.Fatal("an unsigned registration was not refused")
	}

	b, err := New(WithDataDir(t.TempDir()), WithListenAddr("127.0.0.1:0"), WithLogger(testLogger()),
		WithBrokerName("signed"), WithNameServers(ns.Addr()),
		WithNameServerCredentials(aclAdmin), WithNameServerTLS(clientTLS))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Start registers synchronously: the route of a system topic exists now.
	if !hasRoute("SELF_TEST_TOPIC") {
		_ = b.Close()
		t.Fatal("no route after a signed registration over TLS")
	}
	allowed := nsPolicy.Stats().Allowed
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	// The signed UNREGISTER_BROKER was allowed (the unsigned broker's
	// retries only add denials).
	if st := nsPolicy.Stats(); st.Allowed <= allowed {
		t.Fatalf("unregister was not accepted: stats %+v (allowed before: %d)", st, allowed)
	}
}

func TestBrokerSecurityOptionsValidated(t *testing.T) {
	for name, o := range map[string]Option{
		"TLS without a config":      WithTLS(acl.TLSEnforcing, nil),
		"unknown TLS mode":          WithTLS(acl.TLSMode(9), &tls.Config{}),
		"credentials without key":   WithNameServerCredentials(acl.Credentials{AccessKey: "ak"}),
		"credentials without ak":    WithNameServerCredentials(acl.Credentials{SecretKey: "sk"}),
		"negative max conns":        WithRemotingOptions(remoting.WithMaxConns(-1)),
		"negative first-frame time": WithRemotingOptions(remoting.WithFirstFrameTimeout(-time.Second)),
	} {
		if _, err := New(WithDataDir(t.TempDir()), o); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
