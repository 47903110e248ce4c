package javatest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/javapeer"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// TestJavaBrokerPullLongPolling: a pull at the end of a queue with a
// suspend time waits on the Java broker and returns as soon as a message
// arrives; with nothing arriving it returns PULL_NOT_FOUND once the
// suspend time is over (the Java broker checks held pulls every 5 s, so
// not much sooner and at most about 5 s later); without one it returns
// at once.
func TestJavaBrokerPullLongPolling(t *testing.T) {
	eachBrokerParallel(t, func(t *testing.T, d *javapeer.Dist, c *javapeer.Cluster) {
		ctx := bg(t, 2*time.Minute)
		cl := newJavaClient(t, c)
		topic := uniqueName(t, "lp")
		qs := createJavaTopic(t, cl, c, topic, 1)
		q := qs[0]
		group := uniqueName(t, "g")
		p := newJavaProducer(t, cl, uniqueName(t, "pg"))

		start := time.Now()
		res, err := cl.Pull(ctx, client.PullRequest{Queue: q, Offset: 0, Group: group})
		if err != nil {
			t.Fatal(err)
		}
		if el := time.Since(start); res.Status != client.PullNoNewMsg || el > 2*time.Second {
			t.Fatalf("pull without suspend of an empty queue: %v after %v", res.Status, el)
		}

		// Suspend honoured: nothing arrives.
		start = time.Now()
		res, err = cl.Pull(ctx, client.PullRequest{Queue: q, Offset: 0, Group: group, Suspend: 1500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		el := time.Since(start)
		if res.Status != client.PullNoNewMsg || el < 1400*time.Millisecond || el > 12*time.Second {
			t.Fatalf("suspended pull of an empty queue: %v after %v, want NO_NEW_MSG after 1.5–6.5 s", res.Status, el)
		}
		t.Logf("suspend 1.5 s with nothing arriving answered after %v", el.Round(time.Millisecond))

		// A message arriving wakes the held pull.
		type out struct {
			res *client.PullResult
			err error
			el  time.Duration
		}
		done := make(chan out, 1)
		start = time.Now()
		go func() {
			res, err := cl.Pull(ctx, client.PullRequest{Queue: q, Offset: 0, Group: group, Suspend: 20 * time.Second})
			done <- out{res, err, time.Since(start)}
		}()
		time.Sleep(700 * time.Millisecond) // let the pull be held first
		sentAt := time.Since(start)
		sres, err := p.Send(ctx, &client.Message{Topic: topic, Body: []byte("wake")})
		if err != nil {
			t.Fatal(err)
		}
		var o out
		select {
		case o = <-done:
		case <-time.After(40 * time.Second):
			t.Fatal("held pull did not return")
		}
		if o.err != nil {
			t.Fatal(o.err)
		}
		if o.res.Status != client.PullFound || len(o.res.Messages) != 1 || o.res.Messages[0].UniqKey() != sres.MsgID {
			t.Fatalf("held pull: %v %d messages", o.res.Status, len(o.res.Messages))
		}
		// Woken by the arrival, not by the 5 s check nor the suspend time.
		if o.el < sentAt || o.el > sentAt+4*time.Second {
			t.Fatalf("held pull returned after %v; the message was sent after %v", o.el, sentAt)
		}
		if o.res.NextBeginOffset != 1 || o.res.MaxOffset != 1 || o.res.MinOffset != 0 {
			t.Fatalf("held pull: next %d min %d max %d", o.res.NextBeginOffset, o.res.MinOffset, o.res.MaxOffset)
		}
		t.Logf("held pull woken %v after the send", (o.el - sentAt).Round(time.Millisecond))
	})
}

// TestJavaBrokerPullOffsets: offsets outside a queue are outcomes with
// the place to resume (PULL_OFFSET_MOVED), and runnel's offset calls
// (min, max, search by time) agree with what was stored.
func TestJavaBrokerPullOffsets(t *testing.T) {
	eachBroker(t, func(t *testing.T, d *javapeer.Dist, c *javapeer.Cluster) {
		ctx := bg(t, 2*time.Minute)
		cl := newJavaClient(t, c)
		topic := uniqueName(t, "off")
		q := createJavaTopic(t, cl, c, topic, 1)[0]
		group := uniqueName(t, "g")
		p := newJavaProducer(t, cl, uniqueName(t, "pg"))

		// An empty queue: any offset but 0 moved to 0.
		res, err := cl.Pull(ctx, client.PullRequest{Queue: q, Offset: 5, Group: group})
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != client.PullOffsetIllegal || res.NextBeginOffset != 0 {
			t.Fatalf("pull at 5 of an empty queue: %v next %d", res.Status, res.NextBeginOffset)
		}
		var stamps []int64
		for i := range 5 {
			r, err := p.Send(ctx, &client.Message{Topic: topic, Body: fmt.Appendf(nil, "m%d", i)})
			if err != nil {
				t.Fatal(err)
			}
			if r.QueueOffset != int64(i) {
				t.Fatalf("message %d stored at %d", i, r.QueueOffset)
			}
			time.Sleep(5 * time.Millisecond)
		}
		got := pullAll(t, cl, q, group, 0, 5, 20*time.Second)
		for _, m := range got {
			stamps = append(stamps, m.StoreTimestamp)
		}
		if mn, err := cl.MinOffset(ctx, q); err != nil || mn != 0 {
			t.Fatalf("min offset %d, %v", mn, err)
		}
		if mx, err := cl.MaxOffset(ctx, q); err != nil || mx != 5 {
			t.Fatalf("max offset %d, %v", mx, err)
		}
		if off, err := cl.SearchOffset(ctx, q, time.UnixMilli(stamps[3])); err != nil || off > 3 || off < 0 || got[off].StoreTimestamp != stamps[3] {
			t.Fatalf("search offset of the 4th message's store time: %d, %v (stamps %v)", off, err, stamps)
		}
		// Past the end: offset moved to the max offset.
		res, err = cl.Pull(ctx, client.PullRequest{Queue: q, Offset: 100, Group: group})
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != client.PullOffsetIllegal || res.NextBeginOffset != 5 || res.MaxOffset != 5 {
			t.Fatalf("pull at 100 of a 5-message queue: %v next %d max %d", res.Status, res.NextBeginOffset, res.MaxOffset)
		}
		// Exactly at the end: nothing new.
		res, err = cl.Pull(ctx, client.PullRequest{Queue: q, Offset: 5, Group: group})
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != client.PullNoNewMsg || res.NextBeginOffset != 5 {
			t.Fatalf("pull at the end: %v next %d", res.Status, res.NextBeginOffset)
		}
		// A queue that does not exist.
		bad := q
		bad.QueueID = 7
		if _, err := cl.Pull(ctx, client.PullRequest{Queue: bad, Offset: 0, Group: group}); err == nil {
			t.Fatal("pull of queue 7 of a 1-queue topic succeeded")
		} else {
			t.Logf("pull of a queue id beyond the topic's: %v", err)
		}
	})
}

// TestJavaBrokerPullFilters: the Java broker filters by the tag hash codes
// of runnel's subscription expression (server side: a matching message
// behind non-matching ones comes in the first pull of one message), runnel
// drops the messages whose tag only shares the hash (Java's String.hashCode
// of "Aa" and "BB" is the same), and SQL92 expressions on properties work.
func TestJavaBrokerPullFilters(t *testing.T) {
	eachBroker(t, func(t *testing.T, d *javapeer.Dist, c *javapeer.Cluster) {
		ctx := bg(t, 2*time.Minute)
		cl := newJavaClient(t, c)
		topic := uniqueName(t, "filter")
		q := createJavaTopic(t, cl, c, topic, 1)[0]
		p := newJavaProducer(t, cl, uniqueName(t, "pg"))
		tags := []string{"b", "b", "", "BB", "b", "a", "c", "Aa", "a"}
		for i, tag := range tags {
			if _, err := p.Send(ctx, &client.Message{Topic: topic, Body: fmt.Appendf(nil, "m%d", i), Tags: tag,
				Properties: map[string]string{"i": fmt.Sprint(i), "color": []string{"red", "blue"}[i%2]}}); err != nil {
				t.Fatal(err)
			}
		}
		group := uniqueName(t, "g")
		// Server side: the first "a" is at offset 5, behind four others.
		res, err := cl.Pull(ctx, client.PullRequest{Queue: q, Offset: 0, Group: group, Expression: "a", MaxMsgs: 1})
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != client.PullFound || len(res.Messages) != 1 || res.Messages[0].QueueOffset != 5 || res.NextBeginOffset != 6 {
			t.Fatalf("pull of tag a, one message: %v %d messages next %d", res.Status, len(res.Messages), res.NextBeginOffset)
		}
		// Hash-equal tags pass the broker; runnel keeps only the real ones.
		read := func(expr, typ string) []int64 {
			t.Helper()
			var offs []int64
			off := int64(0)
			for off < int64(len(tags)) {
				res, err := cl.Pull(ctx, client.PullRequest{Queue: q, Offset: off, Group: group, Expression: expr, ExpressionType: typ})
				if err != nil {
					t.Fatalf("%s %q: %v", typ, expr, err)
				}
				if res.Status == client.PullNoNewMsg || res.Status == client.PullOffsetIllegal {
					break
				}
				for _, m := range res.Messages {
					offs = append(offs, m.QueueOffset)
				}
				off = res.NextBeginOffset
			}
			return offs
		}
		for expr, want := range map[string][]int64{
			"Aa":     {7},
			"BB":     {3},
			"a || c": {5, 6, 8},
			"b||BB":  {0, 1, 3, 4},
			"*":      {0, 1, 2, 3, 4, 5, 6, 7, 8},
		} {
			if got := read(expr, protocol.ExpressionTypeTag); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("tag expression %q read offsets %v, want %v", expr, got, want)
			}
		}
		if got := read("color = 'blue' AND i > 3", protocol.ExpressionTypeSQL92); fmt.Sprint(got) != fmt.Sprint([]int64{5, 7}) {
			t.Fatalf("SQL92 read offsets %v, want [5 7]", got)
		}
	})
}

// TestJavaBrokerPullInnerBatch: on a 5.x topic with queue.type=BatchCQ the
// Java broker stores a Java producer's batch as one inner-batch record;
// runnel's pull unwraps it into the batch's messages, at consecutive queue
// offsets, with their own bodies, properties and UNIQ_KEYs, as Java's client
// does. (4.9 has no BatchCQ. The broker filters an inner-batch record by
// its own tag, which a Java batch has none of, so tag subscriptions do not
// see such batches, with Java's client as with runnel's.)
func TestJavaBrokerPullInnerBatch(t *testing.T) {
	d, c := javaCluster(t, javapeer.Version5)
	awaitRegistered(t, c)
	ctx := bg(t, 2*time.Minute)
	cl := newJavaClient(t, c)
	topic := uniqueName(t, "bcq")
	testutil.CheckFor(t, 60*time.Second, 100*time.Millisecond, func() error {
		err := cl.CreateTopic(ctx, c.ClusterName, client.TopicConfig{TopicName: topic, ReadQueueNums: 1, WriteQueueNums: 1,
			Attributes: map[string]string{"queue.type": "BatchCQ"}})
		if err != nil && !errors.Is(err, client.ErrNoRoute) {
			t.Fatal(err)
		}
		return err
	})
	var q protocol.MessageQueue
	testutil.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		r, err := cl.RefreshRoute(ctx, topic)
		if err == nil {
			q = r.SubscribeQueues()[0]
		}
		return err
	})
	// One message of runnel's own first: runnel's batches are stored message
	// by message (no inner batch), a single message is a plain record.
	if _, err := newJavaProducer(t, cl, uniqueName(t, "pg")).Send(ctx, &client.Message{Topic: topic, Body: []byte("runnel"), Tags: "a"}); err != nil {
		t.Fatal(err)
	}
	dr := d.NewDriver(t)
	evs, err := dr.Run(ctx, c.NameServer, "produce", "--topic", topic, "--mode", "batch", "--count", "3", "--batch", "3", "--tag", "a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dr.Run(ctx, c.NameServer, "produce", "--topic", topic, "--mode", "batch", "--count", "2", "--batch", "2", "--tag", "b", "--body-prefix", "second"); err != nil {
		t.Fatal(err)
	}
	var batchID string
	for _, ev := range evs {
		if ev.Kind() == "sent" {
			batchID = ev.Str("id")
			if ev.Int("qoff") != 1 {
				t.Fatalf("Java batch stored at %d, want 1 (after runnel's message)", ev.Int("qoff"))
			}
		}
	}
	// Read through a recording proxy, for the golden frame of an
	// inner-batch pull response.
	rc := startRecCluster(t, c.NameServer, c.Broker)
	got := pullAll(t, newJavaClient(t, c, client.WithNameServers(rc.NS.Addr)), q, uniqueName(t, "g"), 0, 6, 20*time.Second)
	saved := false
	for _, f := range rc.Broker.Requests(protocol.ReqPullMessage, false) {
		r, ok := rc.Broker.Response(f)
		if !ok || r.Cmd.Code != protocol.ResSuccess || saved {
			continue
		}
		_ = protocol.DecodeRecords(r.Cmd.Body, func(m *protocol.MessageExt) bool {
			if m.SysFlag&protocol.SysFlagInnerBatch != 0 && !saved {
				saved = true
				writeCaptured(t, "pull_response_inner_batch_java_json.hex", "Captured from Apache RocketMQ 5.3.3 (internal/javatest TestJavaBrokerPullInnerBatch, go test -capture-frames):\n"+
					"the Java broker's FOUND response to a runnel PULL_MESSAGE from offset 0 of a queue.type=BatchCQ topic holding\n"+
					"one runnel message (offset 0), a Java batch of 3 (one inner-batch record, offsets 1-3, tag a) and one of 2 (offsets 4-5, tag b,\n"+
					"bodies second-0, second-1), written by the javapeer driver's produce --mode batch.", r)
			}
			return true
		})
	}
	if !saved {
		t.Fatal("no pull response with an inner-batch record recorded")
	}
	if len(got) != 6 {
		t.Fatalf("pulled %d messages, want 1 + 3 + 2", len(got))
	}
	for i, m := range got {
		body := "runnel"
		if i >= 1 && i <= 3 {
			body = fmt.Sprintf("%s-%d", topic, i-1)
		} else if i > 3 {
			body = fmt.Sprintf("second-%d", i-4)
		}
		if m.QueueOffset != int64(i) || string(m.Body) != body || m.Topic != topic || m.QueueID != q.QueueID {
			t.Fatalf("message %d: offset %d body %q topic %q queue %d", i, m.QueueOffset, m.Body, m.Topic, m.QueueID)
		}
		if i == 0 {
			continue
		}
		wantI, wantTag := i-1, "a"
		if i > 3 {
			wantI, wantTag = i-4, "b"
		}
		if v, _ := m.Property("javapeer_i"); v != fmt.Sprint(wantI) || m.Tags() != wantTag {
			t.Fatalf("message %d: javapeer_i %q tags %q", i, v, m.Tags())
		}
		if m.UniqKey() == "" || m.UniqKey() == batchID {
			t.Fatalf("message %d: UNIQ_KEY %q (the batch's is %s)", i, m.UniqKey(), batchID)
		}
		if m.SysFlag&protocol.SysFlagNeedUnwrap != 0 {
			t.Fatalf("message %d: sysflag %#x still says unwrap", i, m.SysFlag)
		}
	}
}
