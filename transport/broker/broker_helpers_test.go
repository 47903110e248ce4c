package broker

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil/poll"
	"github.com/runnel-dev/runnel/transport/namesrv"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// testLogger logs to stderr when BROKER_TEST_LOG is set, else discards.
func testLogger() *slog.Logger {
	if os.Getenv("BROKER_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return nil
}

// newStartedBroker starts a broker on 127.0.0.1:0 with a fresh data dir
// (opts apply after these defaults and may override them); stopping it is
// the caller's business.
func newStartedBroker(tb testing.TB, opts ...Option) *Broker {
	tb.Helper()
	all := append([]Option{WithDataDir(tb.TempDir()), WithListenAddr("127.0.0.1:0"), WithLogger(testLogger())}, opts...)
	b, err := New(all...)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		tb.Fatalf("Start: %v", err)
	}
	return b
}

// startBroker is newStartedBroker, shut down gracefully at the end of the
// test (an error of that shutdown fails the test).
func startBroker(tb testing.TB, opts ...Option) *Broker {
	tb.Helper()
	b := newStartedBroker(tb, opts...)
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.Shutdown(ctx); err != nil {
			tb.Errorf("Shutdown: %v", err)
		}
	})
	return b
}

// startNameServer starts a real name server on 127.0.0.1:0.
func startNameServer(tb testing.TB) *namesrv.Server {
	tb.Helper()
	return startNameServerAt(tb, "127.0.0.1:0")
}

// startNameServerAt starts a real name server on addr.
//
// A fixed addr that was closed a moment ago may be briefly taken: the
// broker keeps dialing it to register, and a dial to a port nobody listens
// on can be given that very port as its own (a TCP self-connect, which Go's
// dialer detects and closes). The bind is retried for a few seconds then.
func startNameServerAt(tb testing.TB, addr string) *namesrv.Server {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		ns, err := namesrv.New(namesrv.WithListenAddr(addr), namesrv.WithKVConfigDir(tb.TempDir()))
		if err != nil {
			tb.Fatalf("namesrv.New: %v", err)
		}
		err = ns.Start(ctx)
		if err == nil {
			tb.Cleanup(func() { _ = ns.Close() })
			return ns
		}
		if !strings.Contains(err.Error(), "address already in use") || ctx.Err() != nil {
			tb.Fatalf("namesrv.Start: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dial connects a client to addr, closed at the end of the test.
func dial(tb testing.TB, addr string) *remoting.Conn {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := remoting.Dial(ctx, addr)
	if err != nil {
		tb.Fatalf("Dial: %v", err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// invoke sends req and returns the response (failing on transport errors).
func invoke(tb testing.TB, c *remoting.Conn, req *protocol.Command) *protocol.Command {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Invoke(ctx, req)
	if err != nil {
		tb.Fatalf("Invoke code %d: %v", req.Code, err)
	}
	return resp
}

// sendReq builds a SEND_MESSAGE request the way the Go client does.
func sendReq(topic string, queueID int32, body []byte, props string) *protocol.Command {
	req := protocol.NewRequest(protocol.ReqSendMessage)
	h := protocol.SendMessageRequestHeader{
		ProducerGroup: "pg", Topic: topic, DefaultTopic: topicDefault, DefaultTopicQueueNums: 4,
		QueueID: queueID, BornTimestamp: time.Now().UnixMilli(), Properties: props,
		ReconsumeTimes: protocol.Some[int32](0), UnitMode: protocol.Some(false),
		Batch: protocol.Some(false), MaxReconsumeTimes: protocol.Some[int32](0), BrokerName: DefaultBrokerName,
	}
	h.Encode(req)
	req.Body = body
	return req
}

// batchReq is a SEND_BATCH_MESSAGE to queue 0 of topic with n items, item
// i made by item (flag, body, properties).
func batchReq(tb testing.TB, topic string, n int, item func(i int) (int32, []byte, string)) *protocol.Command {
	tb.Helper()
	var body []byte
	for i := range n {
		flag, b, props := item(i)
		var err error
		if body, err = protocol.AppendBatchItem(body, flag, b, props); err != nil {
			tb.Fatal(err)
		}
	}
	req := protocol.NewRequest(protocol.ReqSendBatchMessage)
	(&protocol.SendMessageRequestHeaderV2{ProducerGroup: "pg", Topic: topic, DefaultTopic: topicDefault,
		DefaultTopicQueueNums: 4, QueueID: 0, BornTimestamp: time.Now().UnixMilli(), Batch: protocol.Some(true)}).Encode(req)
	req.Body = body
	return req
}

// send sends one message and requires success.
func send(tb testing.TB, c *remoting.Conn, topic string, queueID int32, body []byte, props string) protocol.SendMessageResponseHeader {
	tb.Helper()
	resp := invoke(tb, c, sendReq(topic, queueID, body, props))
	if resp.Code != protocol.ResSuccess {
		tb.Fatalf("send to %s: code %d %s", topic, resp.Code, resp.Remark)
	}
	var rh protocol.SendMessageResponseHeader
	if err := rh.Decode(resp); err != nil {
		tb.Fatalf("send response header: %v", err)
	}
	return rh
}

// pullArgs describes a pull request.
type pullArgs struct {
	group, topic string
	queue        int32
	offset       int64
	max          int32
	sysFlag      int32
	suspendMS    int64
	sub          string
	commit       int64
}

func pullRequest(a pullArgs) *protocol.Command {
	req := protocol.NewRequest(protocol.ReqPullMessage)
	if a.group == "" {
		a.group = "cg"
	}
	h := protocol.PullMessageRequestHeader{
		ConsumerGroup: a.group, Topic: a.topic, QueueID: a.queue, QueueOffset: a.offset,
		MaxMsgNums: a.max, SysFlag: a.sysFlag, CommitOffset: a.commit,
		SuspendTimeoutMillis: a.suspendMS, Subscription: a.sub, ExpressionType: protocol.ExpressionTypeTag,
	}
	h.Encode(req)
	return req
}

// pullResult is a decoded pull response.
type pullResult struct {
	code int32
	h    protocol.PullMessageResponseHeader
	msgs []protocol.MessageExt
}

func pull(tb testing.TB, c *remoting.Conn, a pullArgs) pullResult {
	tb.Helper()
	return decodePull(tb, invoke(tb, c, pullRequest(a)))
}

func decodePull(tb testing.TB, resp *protocol.Command) pullResult {
	tb.Helper()
	r := pullResult{code: resp.Code}
	if resp.Code == protocol.ResSuccess || resp.Code == protocol.ResPullNotFound ||
		resp.Code == protocol.ResPullRetryImmediately || resp.Code == protocol.ResPullOffsetMoved {
		if err := r.h.Decode(resp); err != nil {
			tb.Fatalf("pull response header (code %d): %v", resp.Code, err)
		}
	}
	if err := protocol.DecodeRecords(resp.Body, func(m *protocol.MessageExt) bool {
		r.msgs = append(r.msgs, m.Clone())
		return true
	}); err != nil {
		tb.Fatalf("pull body: %v", err)
	}
	return r
}

// waitFor polls cond every few milliseconds until it holds or d passes.
func waitFor(tb testing.TB, d time.Duration, what string, cond func() bool) {
	tb.Helper()
	poll.Until(tb, d, 2*time.Millisecond, func() error {
		if cond() {
			return nil
		}
		return errors.New("waiting for " + what)
	})
}

func props(kv ...string) string {
	var b []byte
	for i := 0; i+1 < len(kv); i += 2 {
		b = protocol.AppendProperty(b, kv[i], kv[i+1])
	}
	return string(b)
}

func itoa(i int) string { return strconv.Itoa(i) }

func parseInt(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }
