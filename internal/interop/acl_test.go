package interop

import (
	"context"
	"strings"
	"testing"
	"time"

	rocketmq "github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/runnel-dev/runnel/embedded"
	"github.com/runnel-dev/runnel/transport/acl"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// The ACL interop tests run the official Go client with and without
// credentials (primitive.Credentials, which it signs requests with as
// RocketMQ's AclClientRPCHook does) against a runnel broker built with
// broker.WithACL.

var (
	aclInteropAdmin = acl.Credentials{AccessKey: "interop-admin", SecretKey: "interop-admin-secret"}
	aclInteropApp   = acl.Credentials{AccessKey: "interop-app", SecretKey: "interop-app-secret"}
)

func aclInteropPolicy(tb testing.TB) *acl.Policy {
	tb.Helper()
	p, err := acl.NewPolicy(&acl.Config{Accounts: []acl.Account{
		{AccessKey: aclInteropAdmin.AccessKey, SecretKey: aclInteropAdmin.SecretKey, Admin: true},
		{AccessKey: aclInteropApp.AccessKey, SecretKey: aclInteropApp.SecretKey,
			DefaultTopicPerm: "PUB|SUB", DefaultGroupPerm: "SUB"},
	}})
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// aclInteropEnv is a name server (with ACL when asked) and a broker with
// ACL that signs its registration with the admin account.
type aclInteropEnv struct {
	nsAddr string
	b      *broker.Broker
	policy *acl.Policy
}

// startACLInteropEnv starts an aclInteropEnv; extra options go to the
// broker.
func startACLInteropEnv(tb testing.TB, namesrvACL bool, extra ...broker.Option) *aclInteropEnv {
	tb.Helper()
	p := aclInteropPolicy(tb)
	var opts []embedded.Option
	if namesrvACL {
		opts = append(opts, embedded.WithACL(p, aclInteropAdmin))
	} else {
		opts = append(opts, embedded.WithBrokerOptions(broker.WithACL(p), broker.WithNameServerCredentials(aclInteropAdmin)))
	}
	cl := embedded.Run(tb, append(opts, embedded.WithBrokerOptions(extra...))...)
	return &aclInteropEnv{nsAddr: cl.NameServer(), b: cl.Broker(0).Server(), policy: p}
}

// aclInvokeSigned sends req signed as the admin and returns the response.
func aclInvokeSigned(tb testing.TB, c *remoting.Conn, req *protocol.Command) *protocol.Command {
	tb.Helper()
	acl.Sign(req, aclInteropAdmin)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.Invoke(ctx, req)
	if err != nil {
		tb.Fatal(err)
	}
	return resp
}

// createTopicSigned creates topic on the broker (as the admin) and waits
// until the name server routes it.
func (e *aclInteropEnv) createTopicSigned(tb testing.TB, topic string) {
	tb.Helper()
	bc := dialTB(tb, e.b.Addr())
	req := protocol.NewRequest(protocol.ReqUpdateAndCreateTopic)
	(&protocol.CreateTopicRequestHeader{Topic: topic, DefaultTopic: "TBW102", ReadQueueNums: 2, WriteQueueNums: 2,
		Perm: protocol.PermRead | protocol.PermWrite, TopicFilterType: "SINGLE_TAG"}).Encode(req)
	if resp := aclInvokeSigned(tb, bc, req); resp.Code != protocol.ResSuccess {
		tb.Fatalf("create topic %s: %d %s", topic, resp.Code, resp.Remark)
	}
	nc := dialTB(tb, e.nsAddr)
	waitUntil(tb, 10*time.Second, "route of "+topic, func() bool {
		req := protocol.NewRequest(protocol.ReqGetRouteInfoByTopic)
		(&protocol.GetRouteInfoRequestHeader{Topic: topic}).Encode(req)
		return aclInvokeSigned(tb, nc, req).Code == protocol.ResSuccess
	})
}

// maxOffsetSigned returns the sum of the max offsets of topic's two queues.
func (e *aclInteropEnv) maxOffsetSigned(tb testing.TB, topic string) int64 {
	tb.Helper()
	bc := dialTB(tb, e.b.Addr())
	var sum int64
	for q := range int32(2) {
		req := protocol.NewRequest(protocol.ReqGetMaxOffset)
		(&protocol.GetMaxOffsetRequestHeader{Topic: topic, QueueID: q}).Encode(req)
		resp := aclInvokeSigned(tb, bc, req)
		if resp.Code != protocol.ResSuccess {
			tb.Fatalf("max offset: %d %s", resp.Code, resp.Remark)
		}
		var h protocol.GetMaxOffsetResponseHeader
		if err := h.Decode(resp); err != nil {
			tb.Fatal(err)
		}
		sum += h.Offset
	}
	return sum
}

// newACLProducer starts an official producer with the given credentials
// (nil: none) and no retries, shut down at test end.
func newACLProducer(tb testing.TB, nsAddr string, cr *primitive.Credentials) rocketmq.Producer {
	tb.Helper()
	opts := []producer.Option{
		producer.WithNsResolver(primitive.NewPassthroughResolver([]string{nsAddr})),
		producer.WithGroupName(uniqueName("aclpg")),
		producer.WithInstanceName(uniqueInstance("aclprod")),
		producer.WithRetry(0),
		producer.WithSendMsgTimeout(5 * time.Second),
	}
	if cr != nil {
		opts = append(opts, producer.WithCredentials(*cr))
	}
	p, err := rocketmq.NewProducer(opts...)
	if err != nil {
		tb.Fatal(err)
	}
	if err := p.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = p.Shutdown() })
	return p
}

// TestACLOfficialProducer: against a broker with ACL (its name server open,
// so that every producer finds the route), the official producer with the
// right credentials sends; without credentials, and with a wrong secret,
// the broker answers NO_PERMISSION (the client reports "CODE: 16") and
// stores nothing.
func TestACLOfficialProducer(t *testing.T) {
	env := startACLInteropEnv(t, false)
	topic := uniqueName("AclTopic")
	env.createTopicSigned(t, topic)

	good := newACLProducer(t, env.nsAddr, &primitive.Credentials{AccessKey: aclInteropApp.AccessKey, SecretKey: aclInteropApp.SecretKey})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := good.SendSync(ctx, primitive.NewMessage(topic, []byte("signed")))
	if err != nil {
		t.Fatalf("send with credentials: %v", err)
	}
	if res.Status != primitive.SendOK {
		t.Fatalf("send with credentials: status %v", res.Status)
	}
	if n := env.maxOffsetSigned(t, topic); n != 1 {
		t.Fatalf("%d messages stored, want 1", n)
	}

	for name, cr := range map[string]*primitive.Credentials{
		"no credentials": nil,
		"wrong secret":   {AccessKey: aclInteropApp.AccessKey, SecretKey: "not-the-secret"},
		"unknown key":    {AccessKey: "nobody", SecretKey: "nobody-secret"},
	} {
		t.Run(name, func(t *testing.T) {
			p := newACLProducer(t, env.nsAddr, cr)
			res, err := p.SendSync(ctx, primitive.NewMessage(topic, []byte("refused")))
			if err == nil {
				t.Fatalf("send accepted: %+v", res)
			}
			if !strings.Contains(err.Error(), "CODE: 16") || !strings.Contains(err.Error(), "acl: ") {
				t.Fatalf("send error %q, want NO_PERMISSION (16) from the ACL", err)
			}
		})
	}
	if n := env.maxOffsetSigned(t, topic); n != 1 {
		t.Fatalf("%d messages stored after refused sends, want 1", n)
	}
	if st := env.policy.Stats(); st.Denied < 3 {
		t.Fatalf("policy stats %+v, want at least 3 denials", st)
	}
}

// TestACLOfficialProducerSecuredNameServer: with ACL on the name server
// too, the broker registers with its admin credentials and the official
// producer with credentials resolves routes and sends; one without
// credentials cannot even get a route.
func TestACLOfficialProducerSecuredNameServer(t *testing.T) {
	env := startACLInteropEnv(t, true)
	topic := uniqueName("AclTopicNs")
	env.createTopicSigned(t, topic)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	good := newACLProducer(t, env.nsAddr, &primitive.Credentials{AccessKey: aclInteropApp.AccessKey, SecretKey: aclInteropApp.SecretKey})
	if _, err := good.SendSync(ctx, primitive.NewMessage(topic, []byte("signed"))); err != nil {
		t.Fatalf("send with credentials: %v", err)
	}
	bad := newACLProducer(t, env.nsAddr, nil)
	if res, err := bad.SendSync(ctx, primitive.NewMessage(topic, []byte("refused"))); err == nil {
		t.Fatalf("send without credentials accepted: %+v", res)
	}
	if n := env.maxOffsetSigned(t, topic); n != 1 {
		t.Fatalf("%d messages stored, want 1", n)
	}
}
