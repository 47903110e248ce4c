package javatest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/javapeer"
	"github.com/runnel-dev/runnel/internal/syncbuf"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// The helpers of the TestJavaClient… consumer tests: the official Java
// client's consumers (driver/Consumers.java) against runnel's own name
// server and broker, fed and checked with runnel's client.

// consumeDelayLevel is the step of the delay levels the consumer tests give
// runnel's broker: level n waits n × consumeDelayLevel (a retry of
// reconsume times r waits level 3 + r), so that retries come within a
// second or two, each level still distinguishable from the next.
const consumeDelayLevel = 200 * time.Millisecond

func consumeDelayLevels() []time.Duration {
	levels := make([]time.Duration, 18)
	for i := range levels {
		levels[i] = time.Duration(i+1) * consumeDelayLevel
	}
	return levels
}

// codeCounter counts the requests runnel's broker received, by code, and
// the single-message sends by topic (a remoting interceptor: it sees every
// request before its processor).
type codeCounter struct {
	mu    sync.Mutex
	n     map[int32]int
	sends map[string]int
	pulls map[string]int // PULL_MESSAGE by topic
}

func (c *codeCounter) intercept(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, bool) {
	req := rc.Request()
	var topic string
	switch req.Code {
	case protocol.ReqSendMessage:
		topic, _ = req.Ext("topic")
	case protocol.ReqSendMessageV2:
		topic, _ = req.Ext("b")
	}
	pulled, _ := req.Ext("topic")
	c.mu.Lock()
	if c.n == nil {
		c.n, c.sends, c.pulls = map[int32]int{}, map[string]int{}, map[string]int{}
	}
	c.n[req.Code]++
	if topic != "" {
		c.sends[topic]++
	}
	if req.Code == protocol.ReqPullMessage {
		c.pulls[pulled]++
	}
	c.mu.Unlock()
	return nil, false
}

// sendsTo counts the single-message sends to topic.
func (c *codeCounter) sendsTo(topic string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sends[topic]
}

// pullsOf counts the PULL_MESSAGE requests for topic.
func (c *codeCounter) pullsOf(topic string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pulls[topic]
}

func (c *codeCounter) count(code int32) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[code]
}

// consumePeer is runnel's name server + broker for a Java consumer test,
// with runnel's client and a producer on it.
type consumePeer struct {
	*testutil.Cluster
	client *client.Client
	prod   *client.Producer
	codes  *codeCounter
}

// startConsumePeer starts runnel's cluster with short delay levels, a
// request counter and opts.
func startConsumePeer(t *testing.T, opts ...broker.Option) *consumePeer {
	t.Helper()
	cc := &codeCounter{}
	var logs syncbuf.Buffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("runnel's broker log:\n%s", javapeer.Tail([]byte(logs.String()), 60))
		}
	})
	opts = append([]broker.Option{broker.WithDelayLevels(consumeDelayLevels()),
		broker.WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))),
		broker.WithRemotingOptions(remoting.WithInterceptor(cc.intercept))}, opts...)
	cl := testutil.RunCluster(t, opts...)
	c := cl.NewClient(t)
	return &consumePeer{Cluster: cl, client: c, prod: testutil.NewProducer(t, c, "runnel_feeder"), codes: cc}
}

// fedMsg is a message runnel's client fed a Java consumer.
type fedMsg struct {
	id    string // UNIQ_KEY: the Java client's msgId
	offID string // the broker's offset message id
	topic string
	i     int
	body  string
	tag   string
	key   string
	props map[string]string
	queue int32
	off   int64
}

// sendOne sends message i of the test to queue q: body "<topic>-<i>", key
// "k<i>", user properties "i" and extra.
func (p *consumePeer) sendOne(ctx context.Context, q protocol.MessageQueue, i int, tag string, extra map[string]string) (fedMsg, error) {
	return p.sendBody(ctx, q, i, tag, extra, fmt.Appendf(nil, "%s-%d", q.Topic, i))
}

// sendBody is sendOne with the given body (runnel's producer compresses
// bodies of 4 KiB and more, as Java's does).
func (p *consumePeer) sendBody(ctx context.Context, q protocol.MessageQueue, i int, tag string, extra map[string]string, body []byte) (fedMsg, error) {
	props := map[string]string{"i": strconv.Itoa(i), "javapeer_case": "consume"}
	for k, v := range extra {
		props[k] = v
	}
	m := &client.Message{Topic: q.Topic, Body: body, Tags: tag,
		Keys: []string{fmt.Sprint("k", i)}, Properties: props, Queue: &q}
	r, err := p.prod.Send(ctx, m)
	if err != nil {
		return fedMsg{}, err
	}
	return fedMsg{id: r.MsgID, offID: r.OffsetMsgID, topic: q.Topic, i: i, body: string(m.Body), tag: tag, key: m.Keys[0], props: props,
		queue: r.Queue.QueueID, off: r.QueueOffset}, nil
}

// sendN sends messages from..from+n-1, message i to qs[i%len(qs)], tagged
// tag(i) (nil: no tag).
func (p *consumePeer) sendN(t *testing.T, ctx context.Context, qs []protocol.MessageQueue, from, n int, tag func(int) string) []fedMsg {
	t.Helper()
	out := make([]fedMsg, 0, n)
	for i := from; i < from+n; i++ {
		tg := ""
		if tag != nil {
			tg = tag(i)
		}
		s, err := p.sendOne(ctx, qs[i%len(qs)], i, tg, nil)
		if err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
		out = append(out, s)
	}
	return out
}

// javaRun is one running driver command whose events are collected as
// they come (a goroutine owned by the run, joined by wait).
type javaRun struct {
	name     string
	pr       *javapeer.Proc
	stopFile string
	exited   chan struct{}

	mu  sync.Mutex
	evs []javapeer.Event
}

// startJava starts the driver command cmd (args in --flag value pairs;
// --stop-file is added) and returns at once; t.Cleanup kills it if the
// test did not wait for it. ctx bounds the JVM's life.
func startJava(t *testing.T, ctx context.Context, dr *javapeer.Driver, namesrv, name, cmd string, args ...string) *javaRun {
	t.Helper()
	stop := filepath.Join(t.TempDir(), "stop-"+name)
	pr, err := dr.Start(ctx, namesrv, cmd, append(args, "--stop-file", stop)...)
	if err != nil {
		t.Fatal(err)
	}
	r := &javaRun{name: name, pr: pr, stopFile: stop, exited: make(chan struct{})}
	go func() {
		defer close(r.exited)
		for ev := range pr.Events() {
			r.mu.Lock()
			r.evs = append(r.evs, ev)
			r.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		r.pr.Kill()
		<-r.exited
	})
	return r
}

// events returns the events so far.
func (r *javaRun) events() []javapeer.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.evs)
}

// kind returns the events of kind so far.
func (r *javaRun) kind(kind string) []javapeer.Event {
	var out []javapeer.Event
	for _, ev := range r.events() {
		if ev.Kind() == kind {
			out = append(out, ev)
		}
	}
	return out
}

// okRecvs returns the deliveries the listener consumed successfully.
func (r *javaRun) okRecvs() []javapeer.Event {
	var out []javapeer.Event
	for _, ev := range r.kind("recv") {
		if ok, _ := ev["ok"].(bool); ok {
			out = append(out, ev)
		}
	}
	return out
}

// failed returns the driver's "error" or "timeout" event, if any.
func (r *javaRun) failed() error {
	for _, ev := range r.events() {
		switch ev.Kind() {
		case "error":
			return fmt.Errorf("java %s: %s\n%s", r.name, ev.Str("error"), r.pr.Output())
		case "timeout":
			return fmt.Errorf("java %s timed out: %v", r.name, ev)
		}
	}
	return nil
}

// waitStarted waits for the "started" event.
func (r *javaRun) waitStarted(t *testing.T) {
	t.Helper()
	testutil.CheckFor(t, 60*time.Second, 20*time.Millisecond, func() error {
		if err := r.failed(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-r.exited:
			t.Fatalf("java %s exited before it started: %v\n%s", r.name, r.pr.Wait(), r.pr.Output())
		default:
		}
		if len(r.kind("started")) == 0 {
			return fmt.Errorf("java %s has not started", r.name)
		}
		return nil
	})
}

// wait waits for the JVM to exit and fails t unless it exited cleanly
// without an error or timeout event.
func (r *javaRun) wait(t *testing.T) {
	t.Helper()
	err := r.pr.Wait()
	<-r.exited
	if ferr := r.failed(); ferr != nil {
		t.Fatal(ferr)
	}
	if err != nil {
		t.Fatalf("java %s: %v\n%s", r.name, err, r.pr.Output())
	}
}

// stop asks the driver to shut its consumer down cleanly and waits.
func (r *javaRun) stop(t *testing.T) { t.Helper(); stopAll(t, r) }

// stopAll asks every run to shut down cleanly, then waits for each (the
// shutdowns overlap).
func stopAll(t *testing.T, runs ...*javaRun) {
	t.Helper()
	for _, r := range runs {
		if err := os.WriteFile(r.stopFile, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range runs {
		r.wait(t)
	}
}

// kill SIGKILLs the JVM (no clean shutdown: offsets not persisted since
// the last commit, the connection just drops).
func (r *javaRun) kill() {
	r.pr.Kill()
	<-r.exited
}

// checkRecv checks a Java delivery against what runnel's client sent:
// body, tag, keys and every user property, the queue and its offset.
func checkRecv(t *testing.T, who string, ev javapeer.Event, s fedMsg) {
	t.Helper()
	// A redelivery comes from %RETRY%<group>: its queue and offset are
	// that topic's.
	first := ev.Int("reconsume") == 0
	if ev.Str("topic") != s.topic || ev.Str("body") != s.body || ev.Str("tags") != s.tag || ev.Str("keys") != s.key ||
		(first && (int32(ev.Int("q")) != s.queue || ev.Int("qoff") != s.off)) {
		t.Errorf("%s received %v\nfor sent %+v", who, ev, s)
	}
	props := ev.Props()
	for k, v := range s.props {
		if props[k] != v {
			t.Errorf("%s received %s: property %s=%q, sent %q", who, s.id, k, props[k], v)
		}
	}
}

// bySent indexes sent messages by msgId.
func bySent(sent []fedMsg) map[string]fedMsg {
	m := make(map[string]fedMsg, len(sent))
	for _, s := range sent {
		m[s.id] = s
	}
	return m
}

// brokerOffsets reads group's committed offset of every queue from
// runnel's broker (QUERY_CONSUMER_OFFSET through runnel's client).
func (p *consumePeer) brokerOffsets(t *testing.T, ctx context.Context, group string, qs []protocol.MessageQueue) map[int32]int64 {
	t.Helper()
	out := map[int32]int64{}
	for _, q := range qs {
		off, err := p.client.QueryConsumerOffset(ctx, group, q)
		if err != nil {
			t.Fatalf("QueryConsumerOffset %s %v: %v", group, q, err)
		}
		out[q.QueueID] = off
	}
	return out
}

// maxOffsets reads every queue's max offset from runnel's broker.
func (p *consumePeer) maxOffsets(t *testing.T, ctx context.Context, qs []protocol.MessageQueue) map[int32]int64 {
	t.Helper()
	out := map[int32]int64{}
	for _, q := range qs {
		off, err := p.client.MaxOffset(ctx, q)
		if err != nil {
			t.Fatalf("MaxOffset %v: %v", q, err)
		}
		out[q.QueueID] = off
	}
	return out
}

// pullAll reads every message of queue q of runnel's broker from offset 0
// with runnel's client.
func (p *consumePeer) pullAll(t *testing.T, ctx context.Context, q protocol.MessageQueue) []protocol.MessageExt {
	t.Helper()
	out, err := p.tryPullAll(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// tryPullAll is pullAll returning its error: inside a poll, a topic the
// broker has just created (a %DLQ% topic on a send-back) may not be on the
// name server yet (TOPIC_NOT_EXIST from the route lookup), which the caller
// retries.
func (p *consumePeer) tryPullAll(ctx context.Context, q protocol.MessageQueue) ([]protocol.MessageExt, error) {
	var out []protocol.MessageExt
	for off := int64(0); ; {
		r, err := p.client.Pull(ctx, client.PullRequest{Queue: q, Offset: off, Group: "runnel_reader"})
		if err != nil {
			return out, fmt.Errorf("pull %v at %d: %w", q, off, err)
		}
		if r.Status != client.PullFound {
			return out, nil
		}
		for i := range r.Messages {
			out = append(out, r.Messages[i].Clone())
		}
		off = r.NextBeginOffset
	}
}
