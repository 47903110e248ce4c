package broker

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(childBrokerEnv); dir != "" {
		os.Exit(runChildBroker(dir))
	}
	goleak.VerifyTestMain(m)
}

func TestBrokerNewValidates(t *testing.T) {
	if _, err := New(); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("New without data dir: %v, want ErrInvalidOption", err)
	}
	if _, err := New(WithDataDir(t.TempDir()), WithBrokerName("bad name")); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("bad broker name: %v", err)
	}
	if _, err := New(WithDataDir(t.TempDir()), WithLongPolling(40*time.Second, 1)); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("suspend cap above the client timeout: %v", err)
	}
	b, err := New(WithDataDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil { // never started
		t.Fatal(err)
	}
	if err := b.Start(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Start after Close: %v", err)
	}
}

// TestBrokerSendPull sends single messages to a topic auto-created through
// TBW102 and pulls back the exact records.
func TestBrokerSendPull(t *testing.T) {
	b := startBroker(t)
	c := dial(t, b.Addr())
	const topic = "TopicSendPull"
	var sent []protocol.SendMessageResponseHeader
	for i := range 3 {
		sent = append(sent, send(t, c, topic, 1, []byte("hello-"+itoa(i)), props("TAGS", "TagA", "KEYS", "k"+itoa(i))))
	}
	tc, ok := b.topicConfig(topic)
	if !ok || tc.WriteQueueNums != 4 || tc.ReadQueueNums != 4 || tc.Perm != 6 {
		t.Fatalf("auto-created topic config %+v (exists %v), want 4/4 queues perm 6", tc, ok)
	}
	storeHost := netip.MustParseAddrPort(b.AdvertisedAddr())
	for i, rh := range sent {
		if rh.QueueID != 1 || rh.QueueOffset != int64(i) {
			t.Fatalf("send %d: queue %d offset %d", i, rh.QueueID, rh.QueueOffset)
		}
		if rh.MsgRegion != defaultRegion || !rh.TraceOn.V || len(rh.TransactionID) != 32 {
			t.Fatalf("send %d: response header %+v", i, rh)
		}
	}
	r := pull(t, c, pullArgs{topic: topic, queue: 1, offset: 0, max: 32})
	if r.code != protocol.ResSuccess || len(r.msgs) != 3 {
		t.Fatalf("pull: code %d, %d messages", r.code, len(r.msgs))
	}
	if r.h.NextBeginOffset != 3 || r.h.MinOffset != 0 || r.h.MaxOffset != 3 || r.h.SuggestWhichBrokerID != 0 {
		t.Fatalf("pull header %+v", r.h)
	}
	local := peerAddr(c.LocalAddr())
	for i, m := range r.msgs {
		if m.QueueOffset != int64(i) || m.QueueID != 1 || m.Topic != topic || string(m.Body) != "hello-"+itoa(i) {
			t.Fatalf("record %d: offset %d queue %d topic %q body %q", i, m.QueueOffset, m.QueueID, m.Topic, m.Body)
		}
		host, phys, err := protocol.ParseOffsetMsgID(sent[i].MsgID)
		if err != nil || phys != m.CommitLogOffset || host != storeHost {
			t.Fatalf("record %d: msgId %s → %v %d (%v), record phys %d", i, sent[i].MsgID, host, phys, err, m.CommitLogOffset)
		}
		if m.StoreHost != storeHost || m.BornHost != local {
			t.Fatalf("record %d: store host %v (want %v), born host %v (want %v)", i, m.StoreHost, storeHost, m.BornHost, local)
		}
		if m.UniqKey() != sent[i].TransactionID || m.Tags() != "TagA" {
			t.Fatalf("record %d: UNIQ_KEY %q, transactionId %q, tags %q", i, m.UniqKey(), sent[i].TransactionID, m.Tags())
		}
		if v, _ := m.Property(protocol.PropCluster); v != DefaultClusterName {
			t.Fatalf("record %d: CLUSTER %q", i, v)
		}
		if m.StoreTimestamp <= 0 || m.BodyCRC != protocol.BodyCRC(m.Body) {
			t.Fatalf("record %d: store time %d, crc %d", i, m.StoreTimestamp, m.BodyCRC)
		}
		if i > 0 && m.CommitLogOffset <= r.msgs[i-1].CommitLogOffset {
			t.Fatalf("physical offsets not increasing: %d after %d", m.CommitLogOffset, r.msgs[i-1].CommitLogOffset)
		}
	}
	// maxMsgNums <= 0 means one message.
	r = pull(t, c, pullArgs{topic: topic, queue: 1, offset: 1, max: 0})
	if r.code != protocol.ResSuccess || len(r.msgs) != 1 || r.h.NextBeginOffset != 2 {
		t.Fatalf("pull with maxMsgNums 0: code %d, %d messages, next %d", r.code, len(r.msgs), r.h.NextBeginOffset)
	}
}

// TestBrokerSendVariants covers SEND_MESSAGE_V2, SEND_BATCH_MESSAGE and a
// compressed body.
func TestBrokerSendVariants(t *testing.T) {
	b := startBroker(t)
	c := dial(t, b.Addr())
	const topic = "TopicVariants"

	// V2 single message, queue chosen by the broker.
	v1 := protocol.SendMessageRequestHeader{ProducerGroup: "pg", Topic: topic, DefaultTopic: topicDefault,
		DefaultTopicQueueNums: 2, QueueID: -1, BornTimestamp: 1700000000000, Properties: props("UNIQ_KEY", "MYUNIQ")}
	v2 := v1.ToV2()
	req := protocol.NewRequest(protocol.ReqSendMessageV2)
	v2.Encode(req)
	req.Body = []byte("v2")
	resp := invoke(t, c, req)
	var rh protocol.SendMessageResponseHeader
	if resp.Code != protocol.ResSuccess || rh.Decode(resp) != nil || rh.TransactionID != "MYUNIQ" || rh.QueueID < 0 || rh.QueueID > 1 {
		t.Fatalf("V2 send: code %d %s, header %+v", resp.Code, resp.Remark, rh)
	}
	r := pull(t, c, pullArgs{topic: topic, queue: rh.QueueID, max: 32})
	if len(r.msgs) != 1 || r.msgs[0].UniqKey() != "MYUNIQ" || r.msgs[0].BornTimestamp != 1700000000000 {
		t.Fatalf("V2 pull: %d messages %+v", len(r.msgs), r.msgs)
	}

	// Batch: 5 items in one atomic put with consecutive offsets.
	resp = invoke(t, c, batchReq(t, topic, 5, func(i int) (int32, []byte, string) {
		return int32(i), []byte("b" + itoa(i)), props("TAGS", "T"+itoa(i))
	}))
	if resp.Code != protocol.ResSuccess || rh.Decode(resp) != nil {
		t.Fatalf("batch send: code %d %s", resp.Code, resp.Remark)
	}
	ids := strings.Split(rh.MsgID, ",")
	if len(ids) != 5 {
		t.Fatalf("batch msgIds %q", rh.MsgID)
	}
	r = pull(t, c, pullArgs{topic: topic, queue: 0, offset: rh.QueueOffset, max: 32})
	if len(r.msgs) != 5 {
		t.Fatalf("batch pull: %d messages", len(r.msgs))
	}
	for i, m := range r.msgs {
		_, phys, err := protocol.ParseOffsetMsgID(ids[i])
		if err != nil || phys != m.CommitLogOffset || m.QueueOffset != rh.QueueOffset+int64(i) ||
			m.Flag != int32(i) || string(m.Body) != "b"+itoa(i) || m.Tags() != "T"+itoa(i) || m.UniqKey() != "" {
			t.Fatalf("batch item %d: %+v (msgId %s, %v)", i, m, ids[i], err)
		}
	}

	// Compressed body: stored and served as is.
	plain := bytes.Repeat([]byte("compress me "), 1000)
	z, err := protocol.Compress(nil, plain, 5)
	if err != nil {
		t.Fatal(err)
	}
	req = sendReq(topic, 1, z, "")
	var sh protocol.SendMessageRequestHeader
	if err := sh.Decode(req); err != nil {
		t.Fatal(err)
	}
	sh.SysFlag = protocol.SysFlagCompressed
	sh.Encode(req)
	resp = invoke(t, c, req)
	if resp.Code != protocol.ResSuccess || rh.Decode(resp) != nil {
		t.Fatalf("compressed send: %d %s", resp.Code, resp.Remark)
	}
	r = pull(t, c, pullArgs{topic: topic, queue: 1, offset: rh.QueueOffset, max: 1})
	if len(r.msgs) != 1 || !r.msgs[0].Compressed() || !bytes.Equal(r.msgs[0].Body, z) {
		t.Fatalf("compressed pull: %+v", r.msgs)
	}
	got, err := r.msgs[0].DecompressedBody(1 << 20)
	if err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("decompress: %v", err)
	}
}

// TestBrokerTagFilter checks broker-side tag filtering, including a hash
// collision ("Aa" and "BB" share Java's hashCode) and NO_MATCHED advancing
// the offset.
func TestBrokerTagFilter(t *testing.T) {
	b := startBroker(t)
	c := dial(t, b.Addr())
	const topic = "TopicTags"
	for _, tag := range []string{"TagA", "TagB", "", "TagA", "BB"} {
		p := ""
		if tag != "" {
			p = props("TAGS", tag)
		}
		send(t, c, topic, 0, []byte(tag), p)
	}
	sub := protocol.PullFlagSubscription
	r := pull(t, c, pullArgs{topic: topic, max: 32, sysFlag: sub, sub: "TagA"})
	if r.code != protocol.ResSuccess || len(r.msgs) != 2 || r.msgs[0].QueueOffset != 0 || r.msgs[1].QueueOffset != 3 || r.h.NextBeginOffset != 5 {
		t.Fatalf("TagA: code %d, %d messages, next %d", r.code, len(r.msgs), r.h.NextBeginOffset)
	}
	r = pull(t, c, pullArgs{topic: topic, max: 32, sysFlag: sub, sub: "TagB || TagC"})
	if len(r.msgs) != 1 || r.msgs[0].Tags() != "TagB" {
		t.Fatalf("TagB||TagC: %d messages", len(r.msgs))
	}
	if protocol.TagsHashCode("Aa") != protocol.TagsHashCode("BB") {
		t.Fatal("test premise: Aa and BB collide")
	}
	r = pull(t, c, pullArgs{topic: topic, offset: 3, max: 32, sysFlag: sub, sub: "Aa"})
	if r.code != protocol.ResPullRetryImmediately || len(r.msgs) != 0 || r.h.NextBeginOffset != 5 {
		t.Fatalf("Aa (collides with BB): code %d, %d messages, next %d", r.code, len(r.msgs), r.h.NextBeginOffset)
	}
	r = pull(t, c, pullArgs{topic: topic, max: 32, sysFlag: sub, sub: "*"})
	if len(r.msgs) != 5 {
		t.Fatalf("*: %d messages", len(r.msgs))
	}
	// Without the subscription flag and no heartbeat: everything (gotcha 27).
	r = pull(t, c, pullArgs{topic: topic, max: 32, sub: "TagA"})
	if len(r.msgs) != 5 {
		t.Fatalf("no subscription flag: %d messages", len(r.msgs))
	}
}

// TestBrokerPullStatus walks the offset → status table of §7.5.
func TestBrokerPullStatus(t *testing.T) {
	b := startBroker(t, WithPullLimits(2, 1<<20))
	c := dial(t, b.Addr())
	const topic = "TopicStatus"
	send(t, c, topic, 0, []byte("x"), "") // creates the topic; queue 1 stays empty
	cases := []struct {
		name   string
		queue  int32
		offset int64
		code   int32
		next   int64
	}{
		{"empty queue at 0", 1, 0, protocol.ResPullNotFound, 0},
		{"empty queue beyond 0", 1, 5, protocol.ResPullOffsetMoved, 0},
		{"caught up", 0, 1, protocol.ResPullNotFound, 1},
		{"overflow badly", 0, 7, protocol.ResPullOffsetMoved, 1},
		{"found", 0, 0, protocol.ResSuccess, 1},
	}
	for _, tc := range cases {
		r := pull(t, c, pullArgs{topic: topic, queue: tc.queue, offset: tc.offset, max: 32})
		if r.code != tc.code || r.h.NextBeginOffset != tc.next {
			t.Errorf("%s: code %d next %d, want %d next %d", tc.name, r.code, r.h.NextBeginOffset, tc.code, tc.next)
		}
	}
	for range 4 {
		send(t, c, topic, 0, []byte("y"), "")
	}
	r := pull(t, c, pullArgs{topic: topic, max: 32})
	if len(r.msgs) != 2 || r.h.NextBeginOffset != 2 || r.h.MaxOffset != 5 {
		t.Fatalf("count cap 2: %d messages, header %+v", len(r.msgs), r.h)
	}
	// Truncation makes small offsets OFFSET_TOO_SMALL → minOffset.
	if err := b.store.TruncateBefore(topic, 0, 3); err != nil {
		t.Fatal(err)
	}
	r = pull(t, c, pullArgs{topic: topic, offset: 1, max: 32})
	if r.code != protocol.ResPullOffsetMoved || r.h.NextBeginOffset != 3 || r.h.MinOffset != 3 {
		t.Fatalf("too small: code %d header %+v", r.code, r.h)
	}
}

// TestBrokerLongPolling: a parked pull is answered as soon as a send to its
// queue is acknowledged (milliseconds on an idle machine; the bound is 1 s
// for a loaded one, against a 20 s suspension), and with PULL_NOT_FOUND at
// its suspend timeout.
func TestBrokerLongPolling(t *testing.T) {
	b := startBroker(t)
	c := dial(t, b.Addr())
	pc := dial(t, b.Addr())
	const topic = "TopicLongPoll"
	send(t, c, topic, 2, []byte("first"), "")

	type outcome struct {
		resp *protocol.Command
		err  error
		at   time.Time
	}
	park := func(suspendMS int64) chan outcome {
		ch := make(chan outcome, 1)
		req := pullRequest(pullArgs{topic: topic, queue: 2, offset: 1, max: 32,
			sysFlag: protocol.PullFlagSuspend, suspendMS: suspendMS})
		pc.InvokeAsync(context.Background(), req, func(resp *protocol.Command, err error) {
			ch <- outcome{resp, err, time.Now()}
		})
		return ch
	}

	ch := park(20000)
	waitFor(t, 5*time.Second, "the pull to park", func() bool { return b.lp.count.Load() == 1 })
	sentAt := time.Now()
	send(t, c, topic, 2, []byte("second"), "")
	sendDone := time.Now()
	var o outcome
	select {
	case o = <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("parked pull not answered after a send")
	}
	if o.err != nil {
		t.Fatal(o.err)
	}
	// The send's own time (an fsync, slow on a loaded machine) is not the
	// wake-up's: the bound counts from its answer. A pull the store's
	// notify hook failed to wake would be answered at its 20 s timeout.
	lat := o.at.Sub(sentAt)
	t.Logf("parked pull answered %v after the send started (the send took %v)", lat, sendDone.Sub(sentAt))
	if after := o.at.Sub(sendDone); after > time.Second {
		t.Fatalf("parked pull answered %v after the send was acknowledged, want < 1s (suspended for 20s)", after)
	}
	r := decodePull(t, o.resp)
	if r.code != protocol.ResSuccess || len(r.msgs) != 1 || string(r.msgs[0].Body) != "second" || r.h.NextBeginOffset != 2 {
		t.Fatalf("woken pull: code %d, %d messages, next %d", r.code, len(r.msgs), r.h.NextBeginOffset)
	}

	// Timeout: PULL_NOT_FOUND with nextBeginOffset = request offset.
	start := time.Now()
	req := pullRequest(pullArgs{topic: topic, queue: 2, offset: 2, max: 32, sysFlag: protocol.PullFlagSuspend, suspendMS: 300})
	r = decodePull(t, invoke(t, pc, req))
	waited := time.Since(start)
	if r.code != protocol.ResPullNotFound || r.h.NextBeginOffset != 2 || waited < 250*time.Millisecond || waited > 3*time.Second {
		t.Fatalf("timed-out pull: code %d next %d after %v", r.code, r.h.NextBeginOffset, waited)
	}
	if n := b.lp.count.Load(); n != 0 {
		t.Fatalf("%d pulls still parked", n)
	}

	// A parked pull of a closed connection is dropped.
	gone := dial(t, b.Addr())
	gone.InvokeAsync(context.Background(), req, func(*protocol.Command, error) {})
	waitFor(t, 5*time.Second, "the pull to park", func() bool { return b.lp.count.Load() == 1 })
	_ = gone.Close()
	waitFor(t, 5*time.Second, "the closed connection's pull to be dropped", func() bool { return b.lp.count.Load() == 0 })

	// Shutdown answers parked pulls.
	ch = make(chan outcome, 1)
	req = pullRequest(pullArgs{topic: topic, queue: 2, offset: 2, max: 32, sysFlag: protocol.PullFlagSuspend, suspendMS: 20000})
	pc.InvokeAsync(context.Background(), req, func(resp *protocol.Command, err error) { ch <- outcome{resp, err, time.Now()} })
	waitFor(t, 5*time.Second, "the pull to park", func() bool { return b.lp.count.Load() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case o = <-ch:
		if o.err != nil || o.resp.Code != protocol.ResPullNotFound {
			t.Fatalf("pull at shutdown: %v %+v", o.err, o.resp)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("parked pull not answered at shutdown")
	}
}

// TestBrokerParkBound: beyond the parked-pull bound a pull is answered
// SYSTEM_BUSY at once.
func TestBrokerParkBound(t *testing.T) {
	b := startBroker(t, WithLongPolling(5*time.Second, 1))
	c := dial(t, b.Addr())
	send(t, c, "TopicBound", 0, []byte("x"), "")
	req := pullRequest(pullArgs{topic: "TopicBound", offset: 1, max: 1, sysFlag: protocol.PullFlagSuspend, suspendMS: 5000})
	done := make(chan struct{})
	c.InvokeAsync(context.Background(), req, func(*protocol.Command, error) { close(done) })
	waitFor(t, 5*time.Second, "the pull to park", func() bool { return b.lp.count.Load() == 1 })
	resp := invoke(t, c, pullRequest(pullArgs{topic: "TopicBound", offset: 1, max: 1, sysFlag: protocol.PullFlagSuspend, suspendMS: 5000}))
	if resp.Code != protocol.ResSystemBusy {
		t.Fatalf("second parked pull: code %d, want SYSTEM_BUSY", resp.Code)
	}
	send(t, c, "TopicBound", 0, []byte("y"), "")
	<-done
}

// TestBrokerOffsets covers consumer offsets and the offset queries.
func TestBrokerOffsets(t *testing.T) {
	var now atomic.Int64
	now.Store(1_700_000_000_000)
	b := startBroker(t, WithClock(func() time.Time { return time.UnixMilli(now.Load()) }))
	c := dial(t, b.Addr())
	const topic = "TopicOffsets"

	query := func(q int32, zero protocol.Opt[bool]) *protocol.Command {
		req := protocol.NewRequest(protocol.ReqQueryConsumerOffset)
		h := protocol.QueryConsumerOffsetRequestHeader{ConsumerGroup: "cg", Topic: topic, QueueID: q, SetZeroIfNotFound: zero}
		h.Encode(req)
		return invoke(t, c, req)
	}
	offsetOf := func(resp *protocol.Command) int64 {
		var h protocol.QueryConsumerOffsetResponseHeader
		if resp.Code != protocol.ResSuccess || h.Decode(resp) != nil {
			t.Fatalf("query offset: code %d %s", resp.Code, resp.Remark)
		}
		return h.Offset
	}
	if resp := query(0, protocol.Opt[bool]{}); resp.Code != protocol.ResQueryNotFound {
		t.Fatalf("empty queue, no offset: code %d, want 22", resp.Code)
	}
	for i := range 3 {
		now.Add(1000)
		send(t, c, topic, 0, []byte("m"+itoa(i)), "")
	}
	if off := offsetOf(query(0, protocol.Opt[bool]{})); off != 0 {
		t.Fatalf("young queue: offset %d, want 0", off)
	}
	if resp := query(0, protocol.Some(false)); resp.Code != protocol.ResQueryNotFound {
		t.Fatalf("setZeroIfNotFound=false: code %d", resp.Code)
	}
	update := func(off int64) int32 {
		req := protocol.NewRequest(protocol.ReqUpdateConsumerOffset)
		h := protocol.UpdateConsumerOffsetRequestHeader{ConsumerGroup: "cg", Topic: topic, QueueID: 0, CommitOffset: off}
		h.Encode(req)
		return invoke(t, c, req).Code
	}
	for range 3 { // idempotent
		if code := update(2); code != protocol.ResSuccess {
			t.Fatalf("update offset: code %d", code)
		}
	}
	if off := offsetOf(query(0, protocol.Opt[bool]{})); off != 2 {
		t.Fatalf("after update: offset %d", off)
	}
	// Commit piggybacked on a pull.
	pull(t, c, pullArgs{topic: topic, offset: 2, max: 1, sysFlag: protocol.PullFlagCommitOffset, commit: 1})
	if off := offsetOf(query(0, protocol.Opt[bool]{})); off != 1 {
		t.Fatalf("after pull commit: offset %d", off)
	}
	req := protocol.NewRequest(protocol.ReqUpdateConsumerOffset)
	(&protocol.UpdateConsumerOffsetRequestHeader{ConsumerGroup: "cg", Topic: "NoSuchTopic", QueueID: 0, CommitOffset: 1}).Encode(req)
	if code := invoke(t, c, req).Code; code != protocol.ResTopicNotExist {
		t.Fatalf("update offset of unknown topic: %d", code)
	}

	ext := func(code int32, key string, h interface{ Encode(*protocol.Command) }) int64 {
		req := protocol.NewRequest(code)
		h.Encode(req)
		resp := invoke(t, c, req)
		v, ok := resp.Ext(key)
		if resp.Code != protocol.ResSuccess || !ok {
			t.Fatalf("code %d: response %d %s, %s=%q", code, resp.Code, resp.Remark, key, v)
		}
		n, err := parseInt(v)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if v := ext(protocol.ReqGetMaxOffset, "offset", &protocol.GetMaxOffsetRequestHeader{Topic: topic, QueueID: 0}); v != 3 {
		t.Fatalf("max offset %d", v)
	}
	if v := ext(protocol.ReqGetMinOffset, "offset", &protocol.GetMinOffsetRequestHeader{Topic: topic, QueueID: 0}); v != 0 {
		t.Fatalf("min offset %d", v)
	}
	if v := ext(protocol.ReqGetEarliestMsgStoreTime, "timestamp", &protocol.GetEarliestMsgStoretimeRequestHeader{Topic: topic, QueueID: 0}); v != 1_700_000_001_000 {
		t.Fatalf("earliest store time %d", v)
	}
	if v := ext(protocol.ReqGetEarliestMsgStoreTime, "timestamp", &protocol.GetEarliestMsgStoretimeRequestHeader{Topic: topic, QueueID: 3}); v != -1 {
		t.Fatalf("earliest store time of an empty queue %d", v)
	}
	search := func(ts int64, boundary string) int64 {
		return ext(protocol.ReqSearchOffsetByTimestamp, "offset", &protocol.SearchOffsetRequestHeader{Topic: topic, QueueID: 0, Timestamp: ts, BoundaryType: boundary})
	}
	for _, tc := range []struct {
		ts       int64
		boundary string
		want     int64
	}{
		{1_700_000_000_000, "", 0}, {1_700_000_002_000, "", 1}, {1_700_000_002_500, "", 2},
		{1_700_000_009_000, "", 3}, {1_700_000_002_500, "upper", 1}, {1_700_000_000_000, "upper", 0},
	} {
		if got := search(tc.ts, tc.boundary); got != tc.want {
			t.Errorf("search %d %q: %d, want %d", tc.ts, tc.boundary, got, tc.want)
		}
	}
}

// TestBrokerViewAndQuery covers VIEW_MESSAGE_BY_ID and QUERY_MESSAGE.
func TestBrokerViewAndQuery(t *testing.T) {
	b := startBroker(t)
	c := dial(t, b.Addr())
	const topic = "TopicQuery"
	send(t, c, topic, 0, []byte("a"), props("KEYS", "order-1 order-2"))
	rh := send(t, c, topic, 1, []byte("b"), props("KEYS", "order-2"))

	_, phys, err := protocol.ParseOffsetMsgID(rh.MsgID)
	if err != nil {
		t.Fatal(err)
	}
	req := protocol.NewRequest(protocol.ReqViewMessageByID)
	(&protocol.ViewMessageRequestHeader{Offset: phys}).Encode(req)
	resp := invoke(t, c, req)
	m, _, err := protocol.DecodeRecord(resp.Body)
	if resp.Code != protocol.ResSuccess || err != nil || string(m.Body) != "b" || m.UniqKey() != rh.TransactionID {
		t.Fatalf("view: code %d, %v, %+v", resp.Code, err, m)
	}
	req = protocol.NewRequest(protocol.ReqViewMessageByID)
	(&protocol.ViewMessageRequestHeader{Offset: phys + 1}).Encode(req)
	if resp := invoke(t, c, req); resp.Code != protocol.ResSystemError {
		t.Fatalf("view of a bogus offset: code %d", resp.Code)
	}

	queryKey := func(key string, uniq bool) []protocol.MessageExt {
		req := protocol.NewRequest(protocol.ReqQueryMessage)
		h := protocol.QueryMessageRequestHeader{Topic: topic, Key: key, MaxNum: 32, BeginTimestamp: 0, EndTimestamp: time.Now().Add(time.Hour).UnixMilli()}
		if uniq {
			h.UniqueKeyQuery = protocol.Some(true)
		}
		h.Encode(req)
		resp := invoke(t, c, req)
		if resp.Code == protocol.ResQueryNotFound {
			return nil
		}
		if resp.Code != protocol.ResSuccess {
			t.Fatalf("query %q: code %d %s", key, resp.Code, resp.Remark)
		}
		var out []protocol.MessageExt
		if err := protocol.DecodeRecords(resp.Body, func(m *protocol.MessageExt) bool { out = append(out, m.Clone()); return true }); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if got := queryKey("order-2", false); len(got) != 2 {
		t.Fatalf("query order-2: %d messages", len(got))
	}
	if got := queryKey("order-1", false); len(got) != 1 || string(got[0].Body) != "a" {
		t.Fatalf("query order-1: %+v", got)
	}
	if got := queryKey(rh.TransactionID, true); len(got) != 1 || string(got[0].Body) != "b" {
		t.Fatalf("query by UNIQ_KEY: %+v", got)
	}
	if got := queryKey("nope", false); got != nil {
		t.Fatalf("query nope: %+v", got)
	}

	// A batch of 100 messages with two keys each (more keys than one message
	// may index, taken together): every item is found by each of its keys.
	req = batchReq(t, topic, 100, func(i int) (int32, []byte, string) {
		return 0, []byte("batch-" + itoa(i)), props("KEYS", "bk-"+itoa(i)+" bk-all")
	})
	if resp := invoke(t, c, req); resp.Code != protocol.ResSuccess {
		t.Fatalf("batch send: code %d %s", resp.Code, resp.Remark)
	}
	for i := range 100 {
		if got := queryKey("bk-"+itoa(i), false); len(got) != 1 || string(got[0].Body) != "batch-"+itoa(i) {
			t.Fatalf("query batch item %d by its key: %d messages", i, len(got))
		}
	}
}

// TestBrokerAdmin covers topic and group administration.
func TestBrokerAdmin(t *testing.T) {
	b := startBroker(t)
	c := dial(t, b.Addr())
	create := func(topic string, perm int32) *protocol.Command {
		req := protocol.NewRequest(protocol.ReqUpdateAndCreateTopic)
		h := protocol.CreateTopicRequestHeader{Topic: topic, DefaultTopic: "defaultTopic", ReadQueueNums: 3,
			WriteQueueNums: 3, Perm: perm, TopicFilterType: protocol.TopicFilterSingleTag, Attributes: "+message.type=NORMAL"}
		h.Encode(req)
		return invoke(t, c, req)
	}
	if resp := create("AdminTopic", 6); resp.Code != protocol.ResSuccess {
		t.Fatalf("create: %d %s", resp.Code, resp.Remark)
	}
	getTopic := func(topic string) (*protocol.Command, TopicConfig) {
		req := protocol.NewRequest(protocol.ReqGetTopicConfig)
		(&protocol.GetTopicConfigRequestHeader{Topic: topic}).Encode(req)
		resp := invoke(t, c, req)
		var tc TopicConfig
		if resp.Code == protocol.ResSuccess {
			if err := jsonUnmarshal(resp.Body, &tc); err != nil {
				t.Fatal(err)
			}
		}
		return resp, tc
	}
	if resp, tc := getTopic("AdminTopic"); resp.Code != protocol.ResSuccess || tc.ReadQueueNums != 3 || tc.Perm != 6 || tc.Attributes["message.type"] != "NORMAL" {
		t.Fatalf("get topic: %d %+v", resp.Code, tc)
	}
	resp := invoke(t, c, protocol.NewRequest(protocol.ReqGetAllTopicConfig))
	var w protocol.TopicConfigSerializeWrapper
	if resp.Code != protocol.ResSuccess || w.Decode(resp.Body) != nil {
		t.Fatalf("all topics: %d", resp.Code)
	}
	for _, name := range []string{"AdminTopic", topicDefault, topicSchedule, topicSelfTest, DefaultClusterName + replyTopicSuffix,
		topicOffsetMoved, topicTransHalf, topicTransOpHalf, DefaultBrokerName, DefaultClusterName} {
		if _, ok := w.TopicConfigTable[name]; !ok {
			t.Errorf("topic %s missing from GET_ALL_TOPIC_CONFIG", name)
		}
	}
	if tc := w.TopicConfigTable[topicDefault]; tc.Perm != 7 || tc.WriteQueueNums != 8 {
		t.Errorf("TBW102 %+v", tc)
	}
	if tc := w.TopicConfigTable[topicSchedule]; tc.WriteQueueNums != 18 {
		t.Errorf("schedule topic %+v", tc)
	}
	send(t, c, "AdminTopic", 2, []byte("x"), "")
	req := protocol.NewRequest(protocol.ReqGetTopicStatsInfo)
	(&protocol.GetTopicStatsInfoRequestHeader{Topic: "AdminTopic"}).Encode(req)
	resp = invoke(t, c, req)
	if resp.Code != protocol.ResSuccess || !bytes.Contains(resp.Body, []byte(`"queueId":2,"topic":"AdminTopic"}:{"lastUpdateTimestamp":`)) ||
		!bytes.Contains(resp.Body, []byte(`"maxOffset":1,"minOffset":0}`)) {
		t.Fatalf("topic stats: %d %s", resp.Code, resp.Body)
	}
	if resp := create(topicSchedule, 6); resp.Code != protocol.ResInvalidParameter {
		t.Fatalf("create system topic: %d", resp.Code)
	}
	if resp := create("bad topic", 6); resp.Code != protocol.ResInvalidParameter {
		t.Fatalf("create bad name: %d", resp.Code)
	}
	req = protocol.NewRequest(protocol.ReqDeleteTopicInBroker)
	(&protocol.DeleteTopicRequestHeader{Topic: "AdminTopic"}).Encode(req)
	if resp := invoke(t, c, req); resp.Code != protocol.ResSuccess {
		t.Fatalf("delete: %d %s", resp.Code, resp.Remark)
	}
	if resp, _ := getTopic("AdminTopic"); resp.Code != protocol.ResTopicNotExist {
		t.Fatalf("get deleted topic: %d", resp.Code)
	}
	if n, _ := b.store.MaxOffset("AdminTopic", 2); n != 0 {
		t.Fatalf("deleted topic still has messages: max %d", n)
	}

	// Groups.
	gc := protocol.DefaultSubscriptionGroupConfig("admin-group")
	gc.RetryMaxTimes = 3
	body, err := jsonMarshal(gc)
	if err != nil {
		t.Fatal(err)
	}
	req = protocol.NewRequest(protocol.ReqUpdateAndCreateSubscriptionGroup)
	req.Body = body
	if resp := invoke(t, c, req); resp.Code != protocol.ResSuccess {
		t.Fatalf("create group: %d %s", resp.Code, resp.Remark)
	}
	var gw protocol.SubscriptionGroupWrapper
	resp = invoke(t, c, protocol.NewRequest(protocol.ReqGetAllSubscriptionGroupConfig))
	if resp.Code != protocol.ResSuccess || gw.Decode(resp.Body) != nil || gw.SubscriptionGroupTable["admin-group"].RetryMaxTimes != 3 {
		t.Fatalf("all groups: %d %s", resp.Code, resp.Body)
	}
	req = protocol.NewRequest(protocol.ReqDeleteSubscriptionGroup)
	(&protocol.DeleteSubscriptionGroupRequestHeader{GroupName: "admin-group"}).Encode(req)
	if resp := invoke(t, c, req); resp.Code != protocol.ResSuccess {
		t.Fatalf("delete group: %d", resp.Code)
	}
	if _, ok := b.groupConfig("admin-group", false); ok {
		t.Fatal("group still there")
	}
	if resp := invoke(t, c, configReq("brokerConfigPath=/tmp/x")); resp.Code != protocol.ResNoPermission {
		t.Fatalf("UPDATE_BROKER_CONFIG: %d", resp.Code)
	}
	if resp := invoke(t, c, protocol.NewRequest(9999)); resp.Code != protocol.ResRequestCodeNotSupported {
		t.Fatalf("unknown code: %d", resp.Code)
	}
}

// TestBrokerValidation sends one invalid request per error code: each is
// refused with the expected code, nothing is stored, and the connection
// keeps working.
func TestBrokerValidation(t *testing.T) {
	b := startBroker(t, WithMaxMessageSize(1024))
	c := dial(t, b.Addr())
	send(t, c, "Existing", 0, []byte("x"), "")
	reqCreate := protocol.NewRequest(protocol.ReqUpdateAndCreateTopic)
	(&protocol.CreateTopicRequestHeader{Topic: "ReadOnly", ReadQueueNums: 1, WriteQueueNums: 1, Perm: protocol.PermRead}).Encode(reqCreate)
	if resp := invoke(t, c, reqCreate); resp.Code != protocol.ResSuccess {
		t.Fatalf("create read-only topic: %d", resp.Code)
	}
	withHeader := func(topic string, mut func(h *protocol.SendMessageRequestHeader)) *protocol.Command {
		req := sendReq(topic, 0, []byte("body"), "")
		var h protocol.SendMessageRequestHeader
		if err := h.Decode(req); err != nil {
			t.Fatal(err)
		}
		mut(&h)
		req = protocol.NewRequest(protocol.ReqSendMessage)
		h.Encode(req)
		req.Body = []byte("body")
		return req
	}
	batchReq := func(topic string, body []byte) *protocol.Command {
		req := protocol.NewRequest(protocol.ReqSendBatchMessage)
		(&protocol.SendMessageRequestHeaderV2{ProducerGroup: "pg", Topic: topic, DefaultTopic: topicDefault,
			DefaultTopicQueueNums: 4, QueueID: 0, Batch: protocol.Some(true)}).Encode(req)
		req.Body = body
		return req
	}
	item, _ := protocol.AppendBatchItem(nil, 0, []byte("x"), "")
	bigProps := props("big", strings.Repeat("p", 33000))
	cases := []struct {
		name  string
		req   *protocol.Command
		code  int32
		topic string // must not exist afterwards (when not "Existing")
	}{
		{"body too large", sendReq("NewTopic1", 0, make([]byte, 1025), ""), protocol.ResMessageIllegal, "NewTopic1"},
		{"properties too long", sendReq("NewTopic2", 0, []byte("x"), bigProps), protocol.ResMessageIllegal, "NewTopic2"},
		{"illegal topic char", sendReq("bad/topic", 0, []byte("x"), ""), protocol.ResInvalidParameter, "bad/topic"},
		{"topic too long", sendReq(strings.Repeat("t", 128), 0, []byte("x"), ""), protocol.ResInvalidParameter, strings.Repeat("t", 128)},
		{"blank topic", sendReq("", 0, []byte("x"), ""), protocol.ResInvalidParameter, ""},
		{"system topic", sendReq(topicSchedule, 0, []byte("x"), ""), protocol.ResNoPermission, ""},
		{"no default topic", withHeader("NewTopic3", func(h *protocol.SendMessageRequestHeader) { h.DefaultTopic = "NoSuchDefault" }), protocol.ResTopicNotExist, "NewTopic3"},
		{"default not inheritable", withHeader("NewTopic4", func(h *protocol.SendMessageRequestHeader) { h.DefaultTopic = "Existing" }), protocol.ResTopicNotExist, "NewTopic4"},
		{"queue id too large", sendReq("Existing", 4, []byte("x"), ""), protocol.ResInvalidParameter, "Existing"},
		{"topic not writable", sendReq("ReadOnly", 0, []byte("x"), ""), protocol.ResNoPermission, "ReadOnly"},
		{"transactional batch", func() *protocol.Command {
			req := protocol.NewRequest(protocol.ReqSendBatchMessage)
			(&protocol.SendMessageRequestHeaderV2{ProducerGroup: "pg", Topic: "Existing", DefaultTopic: topicDefault,
				DefaultTopicQueueNums: 4, QueueID: 0, SysFlag: protocol.SysFlagTransactionPrepared, Batch: protocol.Some(true)}).Encode(req)
			req.Body = item
			return req
		}(), protocol.ResMessageIllegal, "Existing"},
		{"batch to retry topic", batchReq("%RETRY%cg", item), protocol.ResMessageIllegal, "%RETRY%cg"},
		{"malformed batch", batchReq("Existing", []byte{0, 0, 0, 99, 1}), protocol.ResMessageIllegal, "Existing"},
		{"missing header field", func() *protocol.Command {
			r := protocol.NewRequest(protocol.ReqSendMessage)
			r.SetExt("topic", "Existing")
			return r
		}(), protocol.ResInvalidParameter, "Existing"},
	}
	maxBefore := func() int64 { n, _ := b.store.MaxOffset("Existing", 0); return n }
	for _, tc := range cases {
		before := maxBefore()
		resp := invoke(t, c, tc.req)
		if resp.Code != tc.code {
			t.Errorf("%s: code %d (%s), want %d", tc.name, resp.Code, resp.Remark, tc.code)
		}
		if after := maxBefore(); after != before {
			t.Errorf("%s: a message was stored (max %d → %d)", tc.name, before, after)
		}
		if tc.topic != "" && tc.topic != "Existing" && tc.topic != "ReadOnly" {
			if _, ok := b.topicConfig(tc.topic); ok {
				t.Errorf("%s: topic %s was created", tc.name, tc.topic)
			}
		}
		if tc.topic == "ReadOnly" {
			if n, _ := b.store.MaxOffset("ReadOnly", 0); n != 0 {
				t.Errorf("%s: stored into the read-only topic", tc.name)
			}
		}
	}
	// Pull errors.
	for _, tc := range []struct {
		name string
		a    pullArgs
		code int32
	}{
		{"unknown topic", pullArgs{topic: "NoSuchTopic", max: 1}, protocol.ResTopicNotExist},
		{"queue out of range", pullArgs{topic: "Existing", queue: 4, max: 1}, protocol.ResInvalidParameter},
		{"negative queue", pullArgs{topic: "Existing", queue: -1, max: 1}, protocol.ResInvalidParameter},
		{"bad group", pullArgs{group: "bad group", topic: "Existing", max: 1}, protocol.ResSubscriptionGroupNotExist},
	} {
		if r := pull(t, c, tc.a); r.code != tc.code {
			t.Errorf("pull %s: code %d, want %d", tc.name, r.code, tc.code)
		}
	}
	req := pullRequest(pullArgs{topic: "Existing", max: 1, sysFlag: protocol.PullFlagSubscription, sub: "a > 1"})
	req.SetExt("expressionType", protocol.ExpressionTypeSQL92)
	if resp := invoke(t, c, req); resp.Code != protocol.ResSystemError {
		t.Errorf("SQL92 pull: code %d", resp.Code)
	}
	// The connection still works.
	send(t, c, "Existing", 0, []byte("after"), "")
	if n := maxBefore(); n != 2 {
		t.Fatalf("Existing max offset %d, want 2", n)
	}
}

// TestBrokerNameServer registers with a real name server: routes of the
// system topics at Start, of an auto-created topic right after its first
// send, gone after Shutdown.
func TestBrokerNameServer(t *testing.T) {
	ns := startNameServer(t)
	b := newStartedBroker(t, WithNameServers(ns.Addr()))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc := dial(t, ns.Addr())
	route := func(topic string) (protocol.TopicRouteData, bool) {
		req := protocol.NewRequest(protocol.ReqGetRouteInfoByTopic)
		(&protocol.GetRouteInfoRequestHeader{Topic: topic}).Encode(req)
		resp := invoke(t, nc, req)
		var rd protocol.TopicRouteData
		if resp.Code != protocol.ResSuccess {
			return rd, false
		}
		if err := rd.Decode(resp.Body); err != nil {
			t.Fatal(err)
		}
		return rd, true
	}
	rd, ok := route(topicDefault)
	if !ok || len(rd.BrokerDatas) != 1 || rd.BrokerDatas[0].BrokerAddrs[0] != b.AdvertisedAddr() ||
		len(rd.QueueDatas) != 1 || rd.QueueDatas[0].Perm != 7 || rd.QueueDatas[0].WriteQueueNums != 8 {
		t.Fatalf("TBW102 route right after Start: %v %+v", ok, rd)
	}
	if _, ok := route("AutoTopic"); ok {
		t.Fatal("AutoTopic routed before it exists")
	}
	c := dial(t, b.Addr())
	send(t, c, "AutoTopic", 0, []byte("x"), "")
	waitFor(t, 5*time.Second, "the AutoTopic route", func() bool {
		rd, ok := route("AutoTopic")
		return ok && rd.QueueDatas[0].WriteQueueNums == 4 && rd.QueueDatas[0].Perm == 6
	})
	if err := b.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the routes to go after Shutdown", func() bool {
		_, ok := route(topicDefault)
		return !ok
	})
}

// TestBrokerRegistrationReconnects: a name server that is down when the
// broker starts, or restarts later, gets the registration once reachable.
func TestBrokerRegistrationReconnects(t *testing.T) {
	ns := startNameServerAt(t, "127.0.0.1:0")
	addr := ns.Addr()
	_ = ns.Close() // down when the broker starts
	startBroker(t, WithNameServers(addr))
	routed := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		c, err := remoting.Dial(ctx, addr)
		if err != nil {
			return false
		}
		defer c.Close()
		req := protocol.NewRequest(protocol.ReqGetRouteInfoByTopic)
		(&protocol.GetRouteInfoRequestHeader{Topic: topicDefault}).Encode(req)
		resp, err := c.Invoke(ctx, req)
		return err == nil && resp.Code == protocol.ResSuccess
	}
	for round := range 2 { // first start, then a restart
		ns = startNameServerAt(t, addr)
		waitFor(t, 15*time.Second, "registration with name server start "+itoa(round), routed)
		_ = ns.Close()
	}
}

// TestBrokerRestart: topics, messages, offsets and groups survive a
// restart on the same data dir.
func TestBrokerRestart(t *testing.T) {
	dir := t.TempDir()
	b1 := newStartedBroker(t, WithDataDir(dir))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := dial(t, b1.Addr())
	var ids []string
	for i := range 5 {
		ids = append(ids, send(t, c, "Durable", int32(i%2), []byte("d"+itoa(i)), "").MsgID)
	}
	req := protocol.NewRequest(protocol.ReqUpdateConsumerOffset)
	(&protocol.UpdateConsumerOffsetRequestHeader{ConsumerGroup: "cg", Topic: "Durable", QueueID: 0, CommitOffset: 2}).Encode(req)
	if resp := invoke(t, c, req); resp.Code != protocol.ResSuccess {
		t.Fatal(resp.Code)
	}
	if err := b1.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()

	b2 := startBroker(t, WithDataDir(dir))
	c = dial(t, b2.Addr())
	if tc, ok := b2.topicConfig("Durable"); !ok || tc.WriteQueueNums != 4 {
		t.Fatalf("topic after restart: %+v %v", tc, ok)
	}
	r0 := pull(t, c, pullArgs{topic: "Durable", queue: 0, max: 32})
	r1 := pull(t, c, pullArgs{topic: "Durable", queue: 1, max: 32})
	if len(r0.msgs) != 3 || len(r1.msgs) != 2 {
		t.Fatalf("after restart: %d + %d messages", len(r0.msgs), len(r1.msgs))
	}
	for i, m := range r0.msgs {
		if m.OffsetMsgID() != ids[2*i] || string(m.Body) != "d"+itoa(2*i) {
			t.Fatalf("queue 0 record %d: %s %q", i, m.OffsetMsgID(), m.Body)
		}
	}
	req = protocol.NewRequest(protocol.ReqQueryConsumerOffset)
	(&protocol.QueryConsumerOffsetRequestHeader{ConsumerGroup: "cg", Topic: "Durable", QueueID: 0}).Encode(req)
	resp := invoke(t, c, req)
	if v, _ := resp.Ext("offset"); resp.Code != protocol.ResSuccess || v != "2" {
		t.Fatalf("offset after restart: %d %q", resp.Code, v)
	}
	if _, ok := b2.groupConfig("cg", false); !ok {
		t.Fatal("auto-created group lost on restart")
	}
	// New messages continue the offsets and physical offsets.
	rh := send(t, c, "Durable", 0, []byte("later"), "")
	if rh.QueueOffset != 3 {
		t.Fatalf("offset after restart %d, want 3", rh.QueueOffset)
	}
}

// TestBrokerExtensions checks the seam: beforeStore can rewrite or reject,
// afterStore sees the result, storeInternal wakes waiters.
func TestBrokerExtensions(t *testing.T) {
	b := startBroker(t)
	var after atomic.Int64
	b.ext.beforeStore = func(_ context.Context, m *InboundMessage) error {
		if v, _ := m.Property("REJECT"); v == "yes" {
			return &protocol.Error{Code: protocol.ResMessageIllegal, Remark: "rejected by hook"}
		}
		m.SetProperty("HOOKED", "1")
		return nil
	}
	b.ext.afterStore = func(_ context.Context, m *InboundMessage, res StoredResult) { after.Add(1) }
	c := dial(t, b.Addr())
	send(t, c, "Hooked", 0, []byte("x"), "")
	if resp := invoke(t, c, sendReq("Hooked", 0, []byte("y"), props("REJECT", "yes"))); resp.Code != protocol.ResMessageIllegal {
		t.Fatalf("rejected send: %d", resp.Code)
	}
	r := pull(t, c, pullArgs{topic: "Hooked", max: 32})
	if len(r.msgs) != 1 || after.Load() != 1 {
		t.Fatalf("%d messages, afterStore %d", len(r.msgs), after.Load())
	}
	if v, _ := r.msgs[0].Property("HOOKED"); v != "1" {
		t.Fatal("beforeStore rewrite not stored")
	}
	m, _, err := b.lookupByPhysicalOffset(r.msgs[0].CommitLogOffset)
	if err != nil || string(m.Body) != "x" {
		t.Fatalf("lookupByPhysicalOffset: %v", err)
	}
	// storeInternal wakes a parked pull.
	ch := make(chan *protocol.Command, 1)
	c.InvokeAsync(context.Background(), pullRequest(pullArgs{topic: "Hooked", offset: 1, max: 32, sysFlag: protocol.PullFlagSuspend, suspendMS: 20000}),
		func(resp *protocol.Command, err error) { ch <- resp })
	waitFor(t, 5*time.Second, "the pull to park", func() bool { return b.lp.count.Load() == 1 })
	res, err := b.storeInternal(context.Background(), &InboundMessage{Topic: "Hooked", QueueID: 0, Body: []byte("internal"), Properties: props("A", "b")})
	if err != nil || res.QueueOffset != 1 {
		t.Fatalf("storeInternal: %+v %v", res, err)
	}
	select {
	case resp := <-ch:
		if r := decodePull(t, resp); len(r.msgs) != 1 || string(r.msgs[0].Body) != "internal" {
			t.Fatalf("woken pull: %+v", r.msgs)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("storeInternal did not wake the parked pull")
	}
	tc, err := b.ensureTopic(context.Background(), "%RETRY%cg", 1, 6)
	if err != nil || tc.WriteQueueNums != 1 {
		t.Fatalf("ensureTopic: %+v %v", tc, err)
	}
	if _, err := b.ensureTopic(context.Background(), "bad name", 1, 6); err == nil {
		t.Fatal("ensureTopic accepted a bad name")
	}
}
