package interop

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rocketmq "github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/admin"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/runnel-dev/runnel/internal/failpoint"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// The broker interop tests run the official Go client, unmodified, against
// runnel's embedded name server and broker started in-process on
// 127.0.0.1 port 0 with a Pebble store under t.TempDir(). Every message a
// test sends is recorded in a ledger with what it carried; what consumers
// receive is compared with it field by field.

// idProp is the user property that names a test message in its ledger.
const idProp = "itest-id"

// seqInstance makes official client instance names unique in the process:
// the official client shares one client (connections, heartbeats, consumer
// table) per "ip@instance" id, and two group members must not share one.
var seqInstance atomic.Int64

func uniqueInstance(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, seqInstance.Add(1))
}

// uniqueName returns a topic or group name unique in the process.
func uniqueName(prefix string) string {
	return fmt.Sprintf("%s_%d_%d", prefix, time.Now().UnixNano()%1_000_000, seqInstance.Add(1))
}

// brokerEnv is a name server and a broker registered with it.
type brokerEnv struct {
	b      *broker.Broker
	nsAddr string
	addr   string // the broker's advertised address
}

// startBrokerEnv starts a name server and a broker (FlushSync, the
// broker's default, unless opts say otherwise) with testutil.RunCluster,
// which returns once the name server routes the broker's topics and stops
// both at the end of the test.
//
// In a child started by runOutsideRace it starts nothing and uses the
// parent's name server and broker instead.
func startBrokerEnv(tb testing.TB, opts ...broker.Option) *brokerEnv {
	tb.Helper()
	if v := os.Getenv(envParentBroker); v != "" {
		nsAddr, addr, ok := strings.Cut(v, ",")
		if !ok {
			tb.Fatalf("%s=%q: want nsAddr,brokerAddr", envParentBroker, v)
		}
		return &brokerEnv{nsAddr: nsAddr, addr: addr}
	}
	cl := testutil.RunCluster(tb, append([]broker.Option{broker.WithFlushMode(broker.FlushSync)}, opts...)...)
	return &brokerEnv{b: cl.Broker, nsAddr: cl.NameServer, addr: cl.Broker.AdvertisedAddr()}
}

// envParentBroker names the environment variable that hands a child test
// process the parent's "nsAddr,brokerAddr".
const envParentBroker = "RUNNEL_INTEROP_PARENT_BROKER"

// runOutsideRace reports whether the calling test must not run its official
// client in this process, and if so runs it instead in a child test
// process built without -race, against a name server and broker started
// here (so the broker still runs under the race detector).
//
// The official client has data races of its own, which the race detector
// reports as failures of whatever test is running: the orderly push
// consumer reads processQueue.msgCache (an unsynchronised gods treemap)
// without its mutex in takeMessages (consumer/process_queue.go, the
// Empty() poll) while the pull goroutine Puts into it under the mutex.
// Tests driving such paths call this first.
func runOutsideRace(t *testing.T, opts ...broker.Option) bool {
	t.Helper()
	if !raceEnabled || os.Getenv(envParentBroker) != "" {
		return false
	}
	env := startBrokerEnv(t, opts...)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	args := []string{"test", "-count=1", "-run", "^" + t.Name() + "$"}
	if failpoint.Enabled {
		args = append(args, "-tags", "failpoints") // as this binary was built
	}
	cmd := exec.CommandContext(ctx, goTool(), append(args, ".")...)
	cmd.Env = append(os.Environ(), envParentBroker+"="+env.nsAddr+","+env.addr)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s in a child without -race: %v\n%s", t.Name(), err, out)
	}
	t.Logf("%s passed in a child built without -race against this process's broker", t.Name())
	return true
}

// goTool returns the go command ($GO, else go on PATH).
func goTool() string {
	if g := os.Getenv("GO"); g != "" {
		return g
	}
	return "go"
}

// dialTB connects runnel's remoting client to addr, closed at test end.
func dialTB(tb testing.TB, addr string) *remoting.Conn {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := remoting.Dial(ctx, addr)
	if err != nil {
		tb.Fatalf("dial %s: %v", addr, err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// invoker is a connection requests can be sent on (*remoting.Conn).
type invoker interface {
	Invoke(context.Context, *protocol.Command) (*protocol.Command, error)
}

// invokeTB sends req on c within 5 s and returns the answer; a transport
// error fails the test with what (the request's name) in front.
func invokeTB(tb testing.TB, c invoker, req *protocol.Command, what string) *protocol.Command {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.Invoke(ctx, req)
	if err != nil {
		tb.Fatalf("%s: %v", what, err)
	}
	return resp
}

// route asks the name server for topic's route; nil when it has none.
func route(ctx context.Context, c *remoting.Conn, topic string) (*protocol.TopicRouteData, error) {
	req := protocol.NewRequest(protocol.ReqGetRouteInfoByTopic)
	h := protocol.GetRouteInfoRequestHeader{Topic: topic}
	h.Encode(req)
	resp, err := c.Invoke(ctx, req)
	if err != nil {
		return nil, err
	}
	if resp.Code != protocol.ResSuccess {
		return nil, nil
	}
	var rd protocol.TopicRouteData
	if err := rd.Decode(resp.Body); err != nil {
		return nil, fmt.Errorf("route body of %s: %w", topic, err)
	}
	return &rd, nil
}

// waitRoute waits until the name server routes topic, with at least
// minQueues write queues when minQueues > 0, or fails after 10 s.
func (e *brokerEnv) waitRoute(tb testing.TB, topic string, minQueues int) {
	tb.Helper()
	c := dialTB(tb, e.nsAddr)
	waitUntil(tb, 10*time.Second, "route of "+topic, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		rd, err := route(ctx, c, topic)
		if err != nil {
			tb.Fatalf("route %s: %v", topic, err)
		}
		if rd == nil || len(rd.QueueDatas) == 0 || len(rd.BrokerDatas) == 0 {
			return false
		}
		return int(rd.QueueDatas[0].WriteQueueNums) >= minQueues
	})
}

// waitNoRoute waits until the name server no longer routes topic.
func (e *brokerEnv) waitNoRoute(tb testing.TB, topic string) {
	tb.Helper()
	c := dialTB(tb, e.nsAddr)
	waitUntil(tb, 10*time.Second, "no route of "+topic, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		rd, err := route(ctx, c, topic)
		if err != nil {
			tb.Fatalf("route %s: %v", topic, err)
		}
		return rd == nil || len(rd.QueueDatas) == 0
	})
}

// consumerCount asks the broker how many clients are members of group.
func (e *brokerEnv) consumerCount(tb testing.TB, c *remoting.Conn, group string) int {
	tb.Helper()
	req := protocol.NewRequest(protocol.ReqGetConsumerListByGroup)
	h := protocol.GetConsumerListByGroupRequestHeader{ConsumerGroup: group}
	h.Encode(req)
	resp := invokeTB(tb, c, req, "GET_CONSUMER_LIST_BY_GROUP")
	if resp.Code != protocol.ResSuccess {
		return 0
	}
	var body protocol.GetConsumerListByGroupResponseBody
	if err := body.Decode(resp.Body); err != nil {
		tb.Fatalf("consumer list body: %v", err)
	}
	return len(body.ConsumerIDList)
}

// waitUntil polls cond every few milliseconds until it holds, or fails the
// test after d.
func waitUntil(tb testing.TB, d time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// newProducer starts an official producer on env, shut down at test end.
func newProducer(tb testing.TB, env *brokerEnv, opts ...producer.Option) rocketmq.Producer {
	tb.Helper()
	all := append([]producer.Option{
		producer.WithNsResolver(primitive.NewPassthroughResolver([]string{env.nsAddr})),
		producer.WithGroupName(uniqueName("pg")),
		producer.WithInstanceName(uniqueInstance("prod")),
		producer.WithRetry(2),
		producer.WithSendMsgTimeout(10 * time.Second),
	}, opts...)
	p, err := rocketmq.NewProducer(all...)
	if err != nil {
		tb.Fatalf("NewProducer: %v", err)
	}
	if err := p.Start(); err != nil {
		tb.Fatalf("producer Start: %v", err)
	}
	tb.Cleanup(func() { _ = p.Shutdown() })
	return p
}

// newPushConsumer returns an official push consumer of group on env (not
// started: subscribe first), shut down at test end unless stopped before.
func newPushConsumer(tb testing.TB, env *brokerEnv, group, instance string, opts ...consumer.Option) rocketmq.PushConsumer {
	tb.Helper()
	all := append([]consumer.Option{
		consumer.WithNsResolver(primitive.NewPassthroughResolver([]string{env.nsAddr})),
		consumer.WithGroupName(group),
		consumer.WithInstance(instance),
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset),
	}, opts...)
	c, err := rocketmq.NewPushConsumer(all...)
	if err != nil {
		tb.Fatalf("NewPushConsumer: %v", err)
	}
	tb.Cleanup(func() { _ = c.Shutdown() })
	return c
}

// newAdmin returns an official admin client on env, closed at test end.
func newAdmin(tb testing.TB, env *brokerEnv) admin.Admin {
	tb.Helper()
	adm, err := admin.NewAdmin(admin.WithResolver(primitive.NewPassthroughResolver([]string{env.nsAddr})))
	if err != nil {
		tb.Fatalf("NewAdmin: %v", err)
	}
	tb.Cleanup(func() { _ = adm.Close() })
	return adm
}

// createTopic creates topic with n read and write queues through the
// official admin client and waits until the name server routes it.
func createTopic(tb testing.TB, env *brokerEnv, topic string, n int) {
	tb.Helper()
	adm := newAdmin(tb, env)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := adm.CreateTopic(ctx, admin.WithTopicCreate(topic), admin.WithBrokerAddrCreate(env.addr),
		admin.WithReadQueueNums(n), admin.WithWriteQueueNums(n)); err != nil {
		tb.Fatalf("CreateTopic %s: %v", topic, err)
	}
	env.waitRoute(tb, topic, n)
}

// expect is what a test message carried when it was sent.
type expect struct {
	id      string
	topic   string
	body    []byte
	tags    string
	keys    []string
	props   map[string]string // user properties, idProp included
	bornMin int64             // ms: just before the send call
	bornMax int64             // ms: just after it returned
	msgID   string            // SendResult.MsgID, "" when unknown (oneway)
	offID   string            // SendResult.OffsetMsgID, "" when unknown
	queue   int               // acknowledged queue id, -1 when unknown
	offset  int64             // acknowledged queue offset, -1 when unknown
}

// received is one delivery of a message to a consumer.
type received struct {
	member string
	at     time.Time
	msg    *primitive.MessageExt
}

// ledger records the messages a test sent and every delivery of them.
// It is safe for concurrent use (consumer callbacks run on many
// goroutines).
type ledger struct {
	mu struct {
		sync.Mutex
		want    map[string]*expect
		got     map[string][]received
		foreign int // deliveries without a known id
	}
	seq atomic.Int64
}

func newLedger() *ledger {
	l := &ledger{}
	l.mu.want = make(map[string]*expect)
	l.mu.got = make(map[string][]received)
	return l
}

// message builds a message for topic with a random body of up to maxBody
// bytes, a tag, two keys and user properties, and records it as expected
// (its born-time window and send result are filled in by sent).
func (l *ledger) message(topic string, maxBody int, extra ...string) (*primitive.Message, *expect) {
	n := l.seq.Add(1)
	id := fmt.Sprintf("m%06d-%x", n, rand.Uint32())
	body := make([]byte, 1+rand.IntN(maxBody))
	for i := range body {
		body[i] = byte(rand.Uint32())
	}
	e := &expect{
		id: id, topic: topic, body: body,
		tags:  "tag" + strconv.Itoa(int(n%3)),
		keys:  []string{"key-" + id, "k" + strconv.Itoa(int(n%7))},
		props: map[string]string{idProp: id, "color": []string{"red", "green", "blue"}[n%3], "n": strconv.FormatInt(n, 10)},
		queue: -1, offset: -1,
	}
	for i := 0; i+1 < len(extra); i += 2 {
		e.props[extra[i]] = extra[i+1]
	}
	m := primitive.NewMessage(topic, body)
	m.WithTag(e.tags)
	m.WithKeys(e.keys)
	for _, k := range slices.Sorted(maps.Keys(e.props)) {
		m.WithProperty(k, e.props[k])
	}
	l.mu.Lock()
	l.mu.want[id] = e
	l.mu.Unlock()
	return m, e
}

// sent completes e with the born-time window and the send result.
func (l *ledger) sent(e *expect, before, after time.Time, res *primitive.SendResult) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e.bornMin, e.bornMax = before.UnixMilli(), after.UnixMilli()
	if res != nil {
		e.msgID, e.offID, e.queue, e.offset = res.MsgID, res.OffsetMsgID, res.MessageQueue.QueueId, res.QueueOffset
	}
}

// drop forgets e (its send failed).
func (l *ledger) drop(e *expect) {
	l.mu.Lock()
	delete(l.mu.want, e.id)
	l.mu.Unlock()
}

// record notes the delivery of msgs to member.
func (l *ledger) record(member string, msgs ...*primitive.MessageExt) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range msgs {
		id := m.GetProperty(idProp)
		if _, ok := l.mu.want[id]; !ok {
			l.mu.foreign++
			continue
		}
		l.mu.got[id] = append(l.mu.got[id], received{member: member, at: now, msg: m})
	}
}

// deliveredAll reports whether every expected message was delivered at
// least once (to anyone, or to member when member != "").
func (l *ledger) deliveredAll(member string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for id := range l.mu.want {
		ok := false
		for _, r := range l.mu.got[id] {
			if member == "" || r.member == member {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// count returns how many expected messages were delivered at least once.
func (l *ledger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for id := range l.mu.want {
		if len(l.mu.got[id]) > 0 {
			n++
		}
	}
	return n
}

// deliveries returns a copy of the deliveries of id.
func (l *ledger) deliveries(id string) []received {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.mu.got[id])
}

// waitAll waits until every expected message was delivered (to member when
// member != "").
func (l *ledger) waitAll(tb testing.TB, d time.Duration, member string) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for !l.deliveredAll(member) {
		if time.Now().After(deadline) {
			l.mu.Lock()
			n := len(l.mu.want)
			l.mu.Unlock()
			tb.Fatalf("timed out after %v: %d of %d messages delivered (member %q)", d, l.count(), n, member)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// verify compares every delivery with what was sent, and requires exactly
// perMember deliveries of each message to each member in members (every
// member when members is nil), or exactly one delivery in all when
// perMember is 0.
func (l *ledger) verify(tb testing.TB, members []string, perMember int) {
	tb.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mu.foreign != 0 {
		tb.Errorf("%d deliveries of messages this test never sent", l.mu.foreign)
	}
	bad := 0
	for id, e := range l.mu.want {
		got := l.mu.got[id]
		if perMember == 0 {
			if len(got) != 1 {
				tb.Errorf("message %s delivered %d times, want exactly once", id, len(got))
				bad++
			}
		} else {
			per := map[string]int{}
			for _, r := range got {
				per[r.member]++
			}
			for _, m := range members {
				if per[m] != perMember {
					tb.Errorf("message %s delivered %d times to %s, want %d", id, per[m], m, perMember)
					bad++
				}
			}
		}
		for _, r := range got {
			if err := e.compare(r.msg); err != nil {
				tb.Errorf("message %s delivered to %s: %v", id, r.member, err)
				bad++
			}
		}
		if bad > 20 {
			tb.Fatalf("too many mismatches; stopping")
		}
	}
}

// compare checks a delivered message against what was sent.
func (e *expect) compare(m *primitive.MessageExt) error {
	var errs []string
	if err := e.compareContent(m.Body, m.GetTags(), m.GetKeys(), m.GetProperty, m.BornTimestamp); err != nil {
		errs = append(errs, err.Error())
	}
	if m.Topic != e.topic {
		errs = append(errs, fmt.Sprintf("topic %q, want %q", m.Topic, e.topic))
	}
	if m.StoreTimestamp < m.BornTimestamp-1000 {
		errs = append(errs, fmt.Sprintf("store timestamp %d long before born timestamp %d", m.StoreTimestamp, m.BornTimestamp))
	}
	if e.msgID != "" && m.MsgId != e.msgID {
		errs = append(errs, fmt.Sprintf("msg id %q, want %q", m.MsgId, e.msgID))
	}
	if e.offID != "" && m.OffsetMsgId != e.offID {
		errs = append(errs, fmt.Sprintf("offset msg id %q, want %q", m.OffsetMsgId, e.offID))
	}
	if e.queue >= 0 && (m.Queue == nil || m.Queue.QueueId != e.queue) {
		errs = append(errs, fmt.Sprintf("queue %v, want %d", m.Queue, e.queue))
	}
	if e.offset >= 0 && m.QueueOffset != e.offset {
		errs = append(errs, fmt.Sprintf("queue offset %d, want %d", m.QueueOffset, e.offset))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// compareContent checks what a message carries (body, tags, keys, user
// properties, born timestamp) against what was sent.
func (e *expect) compareContent(body []byte, tags, keys string, prop func(string) string, born int64) error {
	var errs []string
	if !bytes.Equal(body, e.body) {
		errs = append(errs, fmt.Sprintf("body differs (%d bytes, want %d)", len(body), len(e.body)))
	}
	if tags != e.tags {
		errs = append(errs, fmt.Sprintf("tags %q, want %q", tags, e.tags))
	}
	if want := strings.Join(e.keys, primitive.PropertyKeySeparator); keys != want {
		errs = append(errs, fmt.Sprintf("keys %q, want %q", keys, want))
	}
	for k, v := range e.props {
		if got := prop(k); got != v {
			errs = append(errs, fmt.Sprintf("property %s=%q, want %q", k, got, v))
		}
	}
	if e.bornMax != 0 && (born < e.bornMin || born > e.bornMax) {
		errs = append(errs, fmt.Sprintf("born timestamp %d outside the send window [%d, %d]", born, e.bornMin, e.bornMax))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// expected returns copies of the expected messages.
func (l *ledger) expected() []expect {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]expect, 0, len(l.mu.want))
	for _, e := range l.mu.want {
		out = append(out, *e)
	}
	return out
}

// sendSync sends m with SendSync and records the result in l.
func (l *ledger) sendSync(tb testing.TB, p rocketmq.Producer, m *primitive.Message, e *expect) *primitive.SendResult {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	before := time.Now()
	res, err := p.SendSync(ctx, m)
	after := time.Now()
	if err != nil {
		tb.Fatalf("SendSync: %v", err)
	}
	if res.Status != primitive.SendOK {
		tb.Fatalf("SendSync status %v", res.Status)
	}
	l.sent(e, before, after, res)
	return res
}
