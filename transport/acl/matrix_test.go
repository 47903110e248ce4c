package acl_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/acl"
	"github.com/runnel-dev/runnel/transport/namesrv"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// identity is one column of the matrix: how a request is (not) signed.
type identity struct {
	name string
	sign func(cmd *protocol.Command)
}

func signAs(ak, sk string) func(*protocol.Command) {
	return func(cmd *protocol.Command) { acl.Sign(cmd, acl.Credentials{AccessKey: ak, SecretKey: sk}) }
}

var identities = []identity{
	{"no-credentials", func(*protocol.Command) {}},
	{"bad-signature", signAs("user-ak", "not-the-secret")},
	{"altered-body", func(cmd *protocol.Command) {
		signAs("user-ak", "user-secret")(cmd)
		cmd.Body = append(bytes.Clone(cmd.Body), ' ') // after signing: still valid JSON where it was
	}},
	{"non-admin", signAs("user-ak", "user-secret")},
	{"pub-only", signAs("pub-only", "pub-secret")},
	{"sub-only", signAs("sub-only", "sub-secret")},
	{"deny", signAs("deny-ak", "deny-secret")},
	{"admin", signAs("admin-ak", "admin-secret")},
}

// classes give, per requirement, the identities that must be allowed; all
// others must be denied. Written from the permissions in testConfig, not
// from the implementation.
var classes = map[string][]string{
	"never": {},
	"admin": {"admin"},
	"auth":  {"non-admin", "pub-only", "sub-only", "deny", "admin"},
	"pub":   {"non-admin", "pub-only", "admin"},
	"sub":   {"non-admin", "sub-only", "admin"},
	"route": {"non-admin", "pub-only", "sub-only", "admin"},
}

// matrixCase is one row: a request and its class.
type matrixCase struct {
	name  string
	code  int32
	ext   [][2]string
	body  string
	class string
}

func (mc matrixCase) request() *protocol.Command {
	cmd := protocol.NewRequest(mc.code)
	for _, kv := range mc.ext {
		cmd.SetExt(kv[0], kv[1])
	}
	if mc.body != "" {
		cmd.Body = []byte(mc.body)
	}
	return cmd
}

const (
	consumerHeartbeat = `{"clientID":"c1","consumerDataSet":[{"groupName":"G","consumeType":"CONSUME_PASSIVELY",` +
		`"messageModel":"CLUSTERING","consumeFromWhere":"CONSUME_FROM_LAST_OFFSET","unitMode":false,` +
		`"subscriptionDataSet":[{"topic":"T","subString":"*","tagsSet":[],"codeSet":[],"subVersion":1,"expressionType":"TAG"},` +
		`{"topic":"%RETRY%G","subString":"*","tagsSet":[],"codeSet":[],"subVersion":1,"expressionType":"TAG"}]}],"producerDataSet":[]}`
	producerHeartbeat = `{"clientID":"c1","consumerDataSet":[],"producerDataSet":[{"groupName":"PG"}]}`
	lockBody          = `{"consumerGroup":"G","clientId":"c1","mqSet":[{"topic":"T","brokerName":"b","queueId":0}]}`
)

// brokerCases are representative broker request codes (the broker's own
// processors are tested by its owner; here each code gets a processor that
// only counts).
var brokerCases = []matrixCase{
	{"SEND_MESSAGE", protocol.ReqSendMessage, [][2]string{{"producerGroup", "PG"}, {"topic", topicT}}, "hello", "pub"},
	{"SEND_MESSAGE_V2", protocol.ReqSendMessageV2, [][2]string{{"a", "PG"}, {"b", topicT}}, "hello", "pub"},
	{"SEND_BATCH_MESSAGE", protocol.ReqSendBatchMessage, [][2]string{{"a", "PG"}, {"b", topicT}}, "batch", "pub"},
	{"SEND_REPLY_MESSAGE", protocol.ReqSendReplyMessage, [][2]string{{"topic", topicT}}, "reply", "pub"},
	{"SEND_MESSAGE_V2 to retry topic", protocol.ReqSendMessageV2, [][2]string{{"a", "PG"}, {"b", "%RETRY%G"}}, "x", "sub"},
	{"SEND_MESSAGE without topic", protocol.ReqSendMessage, [][2]string{{"producerGroup", "PG"}}, "x", "admin"},
	{"END_TRANSACTION v4", protocol.ReqEndTransaction, [][2]string{{"producerGroup", "PG"}, {"commitLogOffset", "1"}}, "", "auth"},
	{"END_TRANSACTION v5", protocol.ReqEndTransaction, [][2]string{{"producerGroup", "PG"}, {"topic", topicT}}, "", "pub"},
	{"PULL_MESSAGE", protocol.ReqPullMessage, [][2]string{{"consumerGroup", groupG}, {"topic", topicT}, {"queueId", "0"}}, "", "sub"},
	{"LITE_PULL_MESSAGE", protocol.ReqLitePullMessage, [][2]string{{"consumerGroup", groupG}, {"topic", topicT}}, "", "sub"},
	{"PULL_MESSAGE retry topic", protocol.ReqPullMessage, [][2]string{{"consumerGroup", groupG}, {"topic", "%RETRY%G"}}, "", "sub"},
	{"QUERY_CONSUMER_OFFSET", protocol.ReqQueryConsumerOffset, [][2]string{{"consumerGroup", groupG}, {"topic", topicT}}, "", "sub"},
	{"UPDATE_CONSUMER_OFFSET", protocol.ReqUpdateConsumerOffset, [][2]string{{"consumerGroup", groupG}, {"topic", topicT}}, "", "sub"},
	{"PULL_MESSAGE without group", protocol.ReqPullMessage, [][2]string{{"topic", topicT}}, "", "admin"},
	{"GET_MAX_OFFSET", protocol.ReqGetMaxOffset, [][2]string{{"topic", topicT}, {"queueId", "0"}}, "", "sub"},
	{"GET_MIN_OFFSET", protocol.ReqGetMinOffset, [][2]string{{"topic", topicT}, {"queueId", "0"}}, "", "sub"},
	{"SEARCH_OFFSET_BY_TIMESTAMP", protocol.ReqSearchOffsetByTimestamp, [][2]string{{"topic", topicT}}, "", "sub"},
	{"QUERY_MESSAGE", protocol.ReqQueryMessage, [][2]string{{"topic", topicT}, {"key", "k"}}, "", "sub"},
	{"GET_CONSUMER_LIST_BY_GROUP", protocol.ReqGetConsumerListByGroup, [][2]string{{"consumerGroup", groupG}}, "", "sub"},
	{"CONSUMER_SEND_MSG_BACK", protocol.ReqConsumerSendMsgBack, [][2]string{{"group", groupG}, {"offset", "1"}}, "", "sub"},
	{"UNREGISTER_CLIENT consumer", protocol.ReqUnregisterClient, [][2]string{{"clientID", "c1"}, {"consumerGroup", groupG}}, "", "sub"},
	{"UNREGISTER_CLIENT producer", protocol.ReqUnregisterClient, [][2]string{{"clientID", "c1"}, {"producerGroup", "PG"}}, "", "auth"},
	{"HEART_BEAT consumer", protocol.ReqHeartbeat, nil, consumerHeartbeat, "sub"},
	{"HEART_BEAT producer", protocol.ReqHeartbeat, nil, producerHeartbeat, "auth"},
	{"HEART_BEAT malformed body", protocol.ReqHeartbeat, nil, "{not json", "admin"},
	{"LOCK_BATCH_MQ", protocol.ReqLockBatchMq, nil, lockBody, "sub"},
	{"UNLOCK_BATCH_MQ", protocol.ReqUnlockBatchMq, nil, lockBody, "sub"},
	{"CHECK_CLIENT_CONFIG", protocol.ReqCheckClientConfig, nil, `{"clientId":"c1","group":"G"}`, "auth"},
	{"UPDATE_AND_CREATE_TOPIC", protocol.ReqUpdateAndCreateTopic, [][2]string{{"topic", topicT}}, "", "admin"},
	{"DELETE_TOPIC_IN_BROKER", protocol.ReqDeleteTopicInBroker, [][2]string{{"topic", topicT}}, "", "admin"},
	{"GET_ALL_TOPIC_CONFIG", protocol.ReqGetAllTopicConfig, nil, "", "admin"},
	{"GET_TOPIC_CONFIG", protocol.ReqGetTopicConfig, [][2]string{{"topic", topicT}}, "", "admin"},
	{"UPDATE_BROKER_CONFIG", 25, nil, "brokerConfigPath=/tmp/x", "admin"},
	{"GET_BROKER_RUNTIME_INFO", 28, nil, "", "admin"},
	{"UPDATE_AND_CREATE_SUBSCRIPTIONGROUP", protocol.ReqUpdateAndCreateSubscriptionGroup, nil, `{"groupName":"G"}`, "admin"},
	{"DELETE_SUBSCRIPTIONGROUP", protocol.ReqDeleteSubscriptionGroup, [][2]string{{"groupName", groupG}}, "", "admin"},
	{"GET_CONSUME_STATS", protocol.ReqGetConsumeStats, [][2]string{{"consumerGroup", groupG}}, "", "admin"},
	{"GET_TOPIC_STATS_INFO", protocol.ReqGetTopicStatsInfo, [][2]string{{"topic", topicT}}, "", "admin"},
	{"VIEW_MESSAGE_BY_ID", protocol.ReqViewMessageByID, [][2]string{{"offset", "0"}}, "", "admin"},
	{"GET_CONSUMER_CONNECTION_LIST", protocol.ReqGetConsumerConnectionList, [][2]string{{"consumerGroup", groupG}}, "", "admin"},
	{"unknown code 9999", 9999, [][2]string{{"topic", topicT}}, "", "never"},
	{"POP_MESSAGE", protocol.ReqPopMessage, [][2]string{{"topic", topicT}, {"consumerGroup", groupG}}, "", "sub"},
	{"ACK_MESSAGE", protocol.ReqAckMessage, [][2]string{{"topic", topicT}, {"consumerGroup", groupG}}, "", "sub"},
	{"CHANGE_MESSAGE_INVISIBLETIME", protocol.ReqChangeMessageInvisibleTime, [][2]string{{"topic", topicT}, {"consumerGroup", groupG}}, "", "sub"},
	{"BATCH_ACK_MESSAGE", protocol.ReqBatchAckMessage, nil, `{"acks":[{"c":"G","t":"T","r":"0","so":0,"q":0,"rq":0,"pt":1,"it":1,"b":"AQ=="}]}`, "sub"},
	{"BATCH_ACK_MESSAGE malformed body", protocol.ReqBatchAckMessage, nil, "{not json", "admin"},
	{"QUERY_ASSIGNMENT", protocol.ReqQueryAssignment, nil, `{"topic":"T","consumerGroup":"G","clientId":"c1"}`, "sub"},
	{"SET_MESSAGE_REQUEST_MODE", protocol.ReqSetMessageRequestMode, nil, `{"topic":"T","consumerGroup":"G","mode":"POP"}`, "admin"},
	{"CHECK_TRANSACTION_STATE (server to client)", protocol.ReqCheckTransactionState, nil, "", "never"},
}

// namesrvCases are every request code the name server serves, plus one it
// does not.
var namesrvCases = []matrixCase{
	{"REGISTER_BROKER", protocol.ReqRegisterBroker, [][2]string{{"brokerName", "b"}}, "{}", "admin"},
	{"UNREGISTER_BROKER", protocol.ReqUnregisterBroker, [][2]string{{"brokerName", "b"}}, "", "admin"},
	{"GET_ROUTEINFO_BY_TOPIC", protocol.ReqGetRouteInfoByTopic, [][2]string{{"topic", topicT}}, "", "route"},
	{"GET_ROUTEINFO_BY_TOPIC retry", protocol.ReqGetRouteInfoByTopic, [][2]string{{"topic", "%RETRY%G"}}, "", "sub"},
	{"GET_BROKER_CLUSTER_INFO", protocol.ReqGetBrokerClusterInfo, nil, "", "auth"},
	{"GET_ALL_TOPIC_LIST_FROM_NAMESERVER", protocol.ReqGetAllTopicListFromNameServer, nil, "", "admin"},
	{"DELETE_TOPIC_IN_NAMESRV", protocol.ReqDeleteTopicInNamesrv, [][2]string{{"topic", "nothing"}}, "", "admin"},
	{"GET_TOPICS_BY_CLUSTER", protocol.ReqGetTopicsByCluster, [][2]string{{"cluster", "c"}}, "", "admin"},
	{"WIPE_WRITE_PERM_OF_BROKER", protocol.ReqWipeWritePermOfBroker, [][2]string{{"brokerName", "none"}}, "", "admin"},
	{"ADD_WRITE_PERM_OF_BROKER", namesrv.ReqAddWritePermOfBroker, [][2]string{{"brokerName", "none"}}, "", "admin"},
	{"REGISTER_TOPIC_IN_NAMESRV", protocol.ReqRegisterTopicInNamesrv, [][2]string{{"topic", topicT}}, "", "admin"},
	{"QUERY_DATA_VERSION", protocol.ReqQueryDataVersion, [][2]string{{"brokerName", "b"}}, "", "admin"},
	{"PUT_KV_CONFIG", protocol.ReqPutKVConfig, [][2]string{{"namespace", "n"}, {"key", "k"}, {"value", "v"}}, "", "admin"},
	{"GET_KV_CONFIG", protocol.ReqGetKVConfig, [][2]string{{"namespace", "n"}, {"key", "k"}}, "", "auth"},
	{"DELETE_KV_CONFIG", protocol.ReqDeleteKVConfig, [][2]string{{"namespace", "n"}, {"key", "k"}}, "", "admin"},
	{"GET_KVLIST_BY_NAMESPACE", namesrv.ReqGetKVListByNamespace, [][2]string{{"namespace", "n"}}, "", "auth"},
	{"UPDATE_NAMESRV_CONFIG", namesrv.ReqUpdateNamesrvConfig, nil, "configStorePath=/tmp/x", "admin"},
	{"GET_NAMESRV_CONFIG", namesrv.ReqGetNamesrvConfig, nil, "", "admin"},
	{"unknown code 9999", 9999, nil, "", "never"},
}

// counter counts processor invocations per code.
type counter struct {
	mu   sync.Mutex
	hits map[int32]int
}

func (c *counter) get(code int32) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits[code]
}

// newBrokerLike starts a remoting.Server guarded by p, with a counting
// processor for every code of brokerCases.
func newBrokerLike(t *testing.T, p *acl.Policy, tlsOpts []remoting.ServerOption) (string, *counter) {
	t.Helper()
	s, err := remoting.NewServer(append([]remoting.ServerOption{p.ServerOption()}, tlsOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	cnt := &counter{hits: map[int32]int{}}
	for _, mc := range brokerCases {
		s.Handle(mc.code, remoting.ProcessorFunc(func(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
			cnt.mu.Lock()
			cnt.hits[rc.Request().Code]++
			cnt.mu.Unlock()
			return protocol.NewResponse(rc.Request(), protocol.ResSuccess, "processed"), nil
		}))
	}
	addr, err := s.Listen(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return addr.String(), cnt
}

// newNamesrv starts a real name server guarded by p.
func newNamesrv(t *testing.T, p *acl.Policy, mode acl.TLSMode, cfg *tls.Config) string {
	t.Helper()
	return startNamesrv(t, namesrv.WithACL(p), namesrv.WithTLS(mode, cfg))
}

// startNamesrv starts a real name server on 127.0.0.1 with opts, closed at
// cleanup, and returns its address.
func startNamesrv(t *testing.T, opts ...namesrv.Option) string {
	t.Helper()
	ns, err := namesrv.New(append([]namesrv.Option{namesrv.WithListenAddr("127.0.0.1:0")}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := ns.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ns.Close(); err != nil {
			t.Error(err)
		}
	})
	return ns.Addr()
}

func dial(t *testing.T, addr string, cfg *tls.Config) *remoting.Conn {
	t.Helper()
	var opts []remoting.Option
	if cfg != nil {
		opts = append(opts, remoting.WithTLSConfig(cfg))
	}
	c, err := remoting.Dial(ctxT(t, 5*time.Second), addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func isACLDenial(resp *protocol.Command) bool {
	return resp.Code == protocol.ResNoPermission && strings.HasPrefix(resp.Remark, "acl: ")
}

// TestMatrix runs every case × identity × {TLS off, TLS on} over real TCP,
// against a remoting server with counting processors (broker codes) and
// the real name server (its codes).
func TestMatrix(t *testing.T) {
	p, err := acl.NewPolicy(testConfig())
	if err != nil {
		t.Fatal(err)
	}
	srvTLS, certs := serverCert(t, "server")
	cells := 0
	for _, tlsOn := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", tlsOn), func(t *testing.T) {
			mode, cliTLS := acl.TLSDisabled, (*tls.Config)(nil)
			if tlsOn {
				mode, cliTLS = acl.TLSEnforcing, certs.ClientTLS()
			}
			tlsOpts, err := acl.TLSServerOptions(mode, srvTLS)
			if err != nil {
				t.Fatal(err)
			}
			brokerAddr, cnt := newBrokerLike(t, p, tlsOpts)
			nsAddr := newNamesrv(t, p, mode, srvTLS)
			bc, nc := dial(t, brokerAddr, cliTLS), dial(t, nsAddr, cliTLS)

			for _, side := range []struct {
				name  string
				conn  *remoting.Conn
				cases []matrixCase
				cnt   *counter
			}{{"broker", bc, brokerCases, cnt}, {"namesrv", nc, namesrvCases, nil}} {
				for _, mc := range side.cases {
					allowed, ok := classes[mc.class]
					if !ok {
						t.Fatalf("%s: unknown class %q", mc.name, mc.class)
					}
					for _, id := range identities {
						want := contains(allowed, id.name)
						req := mc.request()
						id.sign(req)
						before := 0
						if side.cnt != nil {
							before = side.cnt.get(mc.code)
						}
						resp, err := side.conn.Invoke(ctxT(t, 5*time.Second), req)
						if err != nil {
							t.Fatalf("%s %s as %s: %v", side.name, mc.name, id.name, err)
						}
						cells++
						denied := isACLDenial(resp)
						if denied == want {
							t.Errorf("%s %s as %s: code %d %q; want allowed=%v", side.name, mc.name, id.name, resp.Code, resp.Remark, want)
							continue
						}
						if side.cnt != nil {
							reached := side.cnt.get(mc.code) > before
							if reached != want || want && resp.Code != protocol.ResSuccess {
								t.Errorf("%s %s as %s: processor reached=%v code %d, want %v", side.name, mc.name, id.name, reached, resp.Code, want)
							}
						}
						if mc.code == namesrv.ReqUpdateNamesrvConfig && want && resp.Code != protocol.ResNoPermission {
							t.Errorf("UPDATE_NAMESRV_CONFIG as %s: code %d: must stay refused", id.name, resp.Code)
						}
					}
				}
			}
		})
	}
	t.Logf("%d cells; policy stats %+v", cells, p.Stats())
	if want := 2 * len(identities) * (len(brokerCases) + len(namesrvCases)); cells != want {
		t.Fatalf("%d cells run, want %d", cells, want)
	}
}

// TestDenialRemarks checks that each kind of failure says what failed.
func TestDenialRemarks(t *testing.T) {
	p, err := acl.NewPolicy(testConfig())
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := newBrokerLike(t, p, nil)
	c := dial(t, addr, nil)
	send := func() *protocol.Command {
		return matrixCase{code: protocol.ReqSendMessage, ext: [][2]string{{"topic", topicT}}, body: "b"}.request()
	}
	for _, tc := range []struct {
		name string
		sign func(*protocol.Command)
		want string
	}{
		{"none", func(*protocol.Command) {}, "acl: no AccessKey"},
		{"unknown key", signAs("who-is-this", "whatever"), `acl: unknown AccessKey "who-is-this"`},
		{"bad signature", signAs("user-ak", "wrong-secret"), `acl: signature mismatch for AccessKey "user-ak"`},
		{"no signature", func(cmd *protocol.Command) { cmd.SetExt(acl.KeyAccessKey, "user-ak") }, "acl: signature mismatch"},
		{"altered header", func(cmd *protocol.Command) { signAs("user-ak", "user-secret")(cmd); cmd.SetExt("topic", "other") }, "acl: signature mismatch"},
		{"added header", func(cmd *protocol.Command) { signAs("user-ak", "user-secret")(cmd); cmd.SetExt("queueId", "1") }, "acl: signature mismatch"},
		{"no permission", signAs("sub-only", "sub-secret"), `acl: "sub-only" lacks PUB on topic "T"`},
	} {
		req := send()
		tc.sign(req)
		resp, err := c.Invoke(ctxT(t, 5*time.Second), req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Code != protocol.ResNoPermission || !strings.HasPrefix(resp.Remark, tc.want) {
			t.Errorf("%s: code %d remark %q, want NO_PERMISSION %q…", tc.name, resp.Code, resp.Remark, tc.want)
		}
	}
}

// TestAllowList checks that the allow-list only restricts: an allowed
// address still needs a signature; an address outside is refused even with
// one.
func TestAllowList(t *testing.T) {
	for _, tc := range []struct {
		cidrs    []string
		signed   bool
		wantDeny string
	}{
		{[]string{"127.0.0.0/8"}, true, ""},
		{[]string{"127.0.0.0/8"}, false, "acl: no AccessKey"},
		{[]string{"10.0.0.0/8", "::1/128"}, true, "acl: address 127.0.0.1:"},
	} {
		cfg := testConfig()
		cfg.AllowCIDRs = tc.cidrs
		p, err := acl.NewPolicy(cfg)
		if err != nil {
			t.Fatal(err)
		}
		addr, _ := newBrokerLike(t, p, nil)
		req := brokerCases[0].request()
		if tc.signed {
			signAs("admin-ak", "admin-secret")(req)
		}
		resp, err := dial(t, addr, nil).Invoke(ctxT(t, 5*time.Second), req)
		if err != nil {
			t.Fatal(err)
		}
		if tc.wantDeny == "" && resp.Code != protocol.ResSuccess ||
			tc.wantDeny != "" && (resp.Code != protocol.ResNoPermission || !strings.HasPrefix(resp.Remark, tc.wantDeny)) {
			t.Errorf("cidrs %v signed %v: code %d %q, want deny %q", tc.cidrs, tc.signed, resp.Code, resp.Remark, tc.wantDeny)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestNamesrvCasesCoverServedCodes keeps namesrvCases complete: every
// request code a real name server (without ACL) serves, found by probing
// codes 0-999 (those not answered REQUEST_CODE_NOT_SUPPORTED), must have a
// row in the matrix, so that a handler added later cannot escape it.
func TestNamesrvCasesCoverServedCodes(t *testing.T) {
	c := dial(t, startNamesrv(t, namesrv.WithKVConfigDir(t.TempDir())), nil)
	inMatrix := map[int32]bool{}
	for _, mc := range namesrvCases {
		inMatrix[mc.code] = true
	}
	var served []int32
	for code := int32(0); code < 1000; code++ {
		resp, err := c.Invoke(ctxT(t, 5*time.Second), protocol.NewRequest(code))
		if err != nil {
			t.Fatalf("code %d: %v", code, err)
		}
		if resp.Code == protocol.ResRequestCodeNotSupported {
			continue
		}
		served = append(served, code)
		if !inMatrix[code] {
			t.Errorf("the name server serves code %d, missing from namesrvCases (requirement %q)", code, acl.Requirement(code))
		}
	}
	t.Logf("%d codes served: %v", len(served), served)
	if len(served) < 15 {
		t.Fatalf("only %d codes served", len(served))
	}
}
