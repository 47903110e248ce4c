package broker

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// TestSendInlineOrder pipelines single-message sends to one queue on one
// connection: served on the reader goroutine, they are stored in the order
// the connection carried them, so their queue offsets follow that order.
// In ASYNC flush mode a send may be committed on the reader goroutine (a
// lone send, or the first of a burst) while the others of its burst go
// to the committer: bursts alternate with lone sends to mix both.
func TestSendInlineOrder(t *testing.T) {
	for _, mode := range []struct {
		name string
		fm   FlushMode
	}{{"sync", FlushSync}, {"async", FlushAsync}} {
		t.Run(mode.name, func(t *testing.T) {
			br := startBroker(t, WithFlushMode(mode.fm))
			c := dial(t, br.Addr())
			const topic = "InlineOrder"
			next := send(t, c, topic, 0, []byte("first"), "").QueueOffset + 1 // creates the topic
			for round := range 6 {
				if got := send(t, c, topic, 0, []byte("lone"), "").QueueOffset; got != next {
					t.Fatalf("round %d: lone send stored at queue offset %d, want %d", round, got, next)
				}
				next++
				next = sendBurstInOrder(t, c, topic, next, 100)
			}
		})
	}
}

// sendBurstInOrder sends n messages to queue 0 of topic without waiting
// between them and checks that they were stored at offsets from, from+1, ...
// in the order they were sent. It returns the next offset.
func sendBurstInOrder(t *testing.T, c *remoting.Conn, topic string, from int64, n int) int64 {
	t.Helper()
	offs := make([]int64, n)
	errs := make([]string, n)
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range n {
		wg.Add(1)
		c.InvokeAsync(ctx, sendReq(topic, 0, []byte("m"+itoa(i)), ""), func(resp *protocol.Command, err error) {
			defer wg.Done()
			var rh protocol.SendMessageResponseHeader
			switch {
			case err != nil:
				errs[i] = err.Error()
			case resp.Code != protocol.ResSuccess:
				errs[i] = resp.Remark
			case rh.Decode(resp) != nil:
				errs[i] = "bad response header"
			default:
				offs[i] = rh.QueueOffset
			}
		})
	}
	wg.Wait()
	for i := range n {
		if errs[i] != "" {
			t.Fatalf("send %d: %s", i, errs[i])
		}
		if want := from + int64(i); offs[i] != want {
			t.Fatalf("send %d stored at queue offset %d, want %d (arrival order)", i, offs[i], want)
		}
	}
	return from + int64(n)
}

// TestSendInlineHandOff pipelines, on one connection, the sends that may
// block (auto-created topics, a batch flagged in SEND_MESSAGE, the first
// timer message, a %RETRY% topic) among plain ones: the former are handed
// to broker goroutines, and every send is answered with what it stored.
func TestSendInlineHandOff(t *testing.T) {
	br := startBroker(t)
	c := dial(t, br.Addr())
	send(t, c, "HandOffPlain", 0, []byte("x"), "")

	batchBody, err := protocol.AppendBatchItem(nil, 0, []byte("b0"), "")
	if err != nil {
		t.Fatal(err)
	}
	batchBody, err = protocol.AppendBatchItem(batchBody, 0, []byte("b1"), "")
	if err != nil {
		t.Fatal(err)
	}
	batchReq := func() *protocol.Command {
		req := protocol.NewRequest(protocol.ReqSendMessage)
		h := protocol.SendMessageRequestHeader{ProducerGroup: "pg", Topic: "HandOffBatch", DefaultTopic: topicDefault,
			DefaultTopicQueueNums: 4, BornTimestamp: time.Now().UnixMilli(), Batch: protocol.Some(true)}
		h.Encode(req)
		req.Body = batchBody
		return req
	}
	type sent struct {
		name string
		req  *protocol.Command
	}
	var reqs []sent
	for i := range 8 {
		reqs = append(reqs,
			sent{"new topic", sendReq("HandOffNew"+itoa(i), 0, []byte("n"), "")},
			sent{"plain", sendReq("HandOffPlain", 0, []byte("p"), "")},
			sent{"batch", batchReq()},
			sent{"timer", sendReq("HandOffPlain", 0, []byte("t"), props(protocol.PropTimerDelaySec, "30"))},
			sent{"retry", sendReq(retryPrefix+"HandOffGroup", 0, []byte("r"), "")},
		)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	codes := make([]int32, len(reqs))
	remarks := make([]string, len(reqs))
	for i, s := range reqs {
		wg.Add(1)
		c.InvokeAsync(ctx, s.req, func(resp *protocol.Command, err error) {
			defer wg.Done()
			if err != nil {
				codes[i], remarks[i] = -1, err.Error()
				return
			}
			codes[i], remarks[i] = resp.Code, resp.Remark
		})
	}
	wg.Wait()
	for i, s := range reqs {
		if codes[i] != protocol.ResSuccess {
			t.Fatalf("send %d (%s): code %d %s", i, s.name, codes[i], remarks[i])
		}
	}
	for i := range 8 {
		if r := pull(t, c, pullArgs{topic: "HandOffNew" + itoa(i), queue: 0, max: 32}); len(r.msgs) != 1 {
			t.Fatalf("topic HandOffNew%d holds %d messages, want 1", i, len(r.msgs))
		}
	}
	if r := pull(t, c, pullArgs{topic: "HandOffBatch", queue: 0, max: 32}); len(r.msgs) != 16 {
		t.Fatalf("batch topic holds %d messages, want 16", len(r.msgs))
	}
	if r := pull(t, c, pullArgs{topic: timerTopic, queue: 0, max: 32}); len(r.msgs) != 8 {
		t.Fatalf("timer topic holds %d messages, want 8", len(r.msgs))
	}
}
