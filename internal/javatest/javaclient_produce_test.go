package javatest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/javapeer"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// produceModes are the DefaultMQProducer send modes TestJavaClientProduce
// runs, in this order, in one producer ("delay" first, so that its
// messages are checked invisible while the others are sent).
var produceModes = []string{"delay", "sync", "async", "oneway", "batch", "ordered"}

// TestJavaClientProduce runs the official Java DefaultMQProducer (5.3.3 and
// 4.9.7) against runnel's broker in every send mode — sync, async with 64
// in flight, oneway, batch, ordered through a MessageQueueSelector, delay
// level 2 — to a topic it auto-creates, and checks what the broker stored
// field by field, read back twice: with runnel's client (PULL) and with
// Java's own decoder (DefaultMQProducer.viewMessage by offset message id):
// body, tags, keys, user properties, queue id and offset equal to the send
// result, the message ids (UNIQ_KEY, and the offset id that Java decodes
// to the broker's address and the record's commit-log offset), born host
// and timestamps within the send. Delayed messages must not be visible in
// their topic before their level's 5 s and must arrive after it, from the
// schedule queue Java's view shows them in at first.
func TestJavaClientProduce(t *testing.T) {
	cl, c := newCluster(t)
	for _, v := range javaVersions {
		t.Run(v, func(t *testing.T) {
			t.Parallel()
			testJavaClientProduce(t, cl, c, v)
		})
	}
}

// sentMsg is one message as the Java producer reported sending it.
type sentMsg struct {
	mode         string
	i            int
	id, offsetID string
	decoded      decodedID
	q            int32
	qoff         int64
	t0, t1       int64
	shard        int
}

func testJavaClientProduce(t *testing.T, cl *testutil.Cluster, c *client.Client, version string) {
	d := javapeer.RequireVersion(t, version)
	dr := d.NewDriver(t)
	topic := uniqueName(t, "JP")
	delayTopic := topic + "_D"
	const perMode = 64
	const delay = 5 * time.Second // level 2
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pr, err := dr.Start(ctx, cl.NameServer, "produce", "--topic", topic, "--delay-topic", delayTopic, "--level", "2",
		"--mode", strings.Join(produceModes, ","), "--count", strconv.Itoa(perMode), "--inflight", "64", "--batch", "8",
		"--tag", "TagA", "--keys", "key-", "--prop", "color=blue,shape=round", "--view", "true",
		"--group", uniqueName(t, "pg"))
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Kill()

	var sent []sentMsg
	stored := map[string]javapeer.Event{} // offset id -> Java's view
	checkedInvisible := 0
	for ev := range pr.Events() {
		switch ev.Kind() {
		case "error", "send-error":
			t.Fatalf("driver: %v\n%s", ev, pr.Output())
		case "stored":
			stored[ev.Str("offset_id")] = ev
		case "async-done":
			t.Logf("async sends: at most %d in flight", ev.Int("max_inflight"))
		case "sent":
			ms, err := sentMessages(ev)
			if err != nil {
				t.Fatal(err)
			}
			sent = append(sent, ms...)
			if ev.Str("mode") == "delay" && time.Now().Before(time.UnixMilli(ev.Int("t0")).Add(delay-time.Second)) {
				// Not visible in its topic yet: nothing in any queue.
				got, err := pullTopic(ctx, c, delayTopic)
				if err != nil && !protocolTopicMissing(err) {
					t.Fatalf("pull %s: %v", delayTopic, err)
				}
				if len(got) > 0 {
					t.Fatalf("delayed message %d visible in %s before its 5 s: %d messages, the first stored at %d, sent at %d",
						ev.Int("i"), delayTopic, len(got), got[0].StoreTimestamp, ev.Int("t0"))
				}
				checkedInvisible++
			}
		}
	}
	if err := pr.Wait(); err != nil {
		t.Fatalf("%v\n%s", err, pr.Output())
	}
	t.Logf("%d messages sent, %d viewed by Java, %d delayed ones checked invisible before their delay", len(sent), len(stored), checkedInvisible)
	if checkedInvisible == 0 {
		t.Errorf("no delayed message was checked invisible before its delay")
	}
	byMode := map[string][]sentMsg{}
	for _, s := range sent {
		byMode[s.mode] = append(byMode[s.mode], s)
	}
	for _, m := range produceModes {
		if len(byMode[m]) != perMode {
			t.Fatalf("the driver reported %d %s sends, want %d", len(byMode[m]), m, perMode)
		}
	}

	// The topic was auto-created by the first send with the Java client's
	// defaultTopicQueueNums (4).
	route, err := c.RefreshRoute(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	if n, w := len(route.SubscribeQueues()), len(route.PublishQueues()); n != 4 || w != 4 {
		t.Errorf("auto-created topic %s has %d read and %d write queues, want 4 and 4", topic, n, w)
	}

	brokerAddr := cl.Broker.AdvertisedAddr()
	for _, s := range sent {
		if s.mode == "oneway" || s.mode == "delay" {
			continue
		}
		m, err := pullAt(ctx, c, protocol.MessageQueue{Topic: topic, BrokerName: testutil.BrokerName, QueueID: s.q}, s.qoff)
		if err != nil {
			t.Fatalf("%s send %d: %v", s.mode, s.i, err)
		}
		keys := "key-" + strconv.Itoa(s.i)
		if s.mode == "ordered" {
			keys = "shard-" + strconv.Itoa(s.shard)
			if want := int32(s.shard % 4); s.q != want {
				t.Errorf("ordered send %d (shard %d) went to queue %d, want %d (the selector's choice)", s.i, s.shard, s.q, want)
			}
		}
		checkStored(t, s, &m, topic, keys, brokerAddr)
		checkJavaView(t, s, &m, stored[s.offsetID])
	}

	// Every message of the topic, oneway ones included, exactly once.
	all, err := pullTopic(ctx, c, topic)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]int{}
	for i := range all {
		m := &all[i]
		n := javaI(m)
		seen[n]++
		if want := fmt.Sprintf("%s-%d", topic, n); string(m.Body) != want {
			t.Errorf("message at %d/%d has body %q, want %q", m.QueueID, m.QueueOffset, m.Body, want)
		}
	}
	for _, s := range sent {
		if s.mode == "delay" {
			continue
		}
		if seen[s.i] != 1 {
			t.Errorf("%s message %d stored %d times, want once", s.mode, s.i, seen[s.i])
		}
	}
	if len(all) != 5*perMode {
		t.Errorf("topic %s holds %d messages, want %d", topic, len(all), 5*perMode)
	}
	for _, s := range byMode["oneway"] {
		for i := range all {
			if m := &all[i]; javaI(m) == s.i && (m.BornTimestamp < s.t0 || m.BornTimestamp > s.t1) {
				t.Errorf("oneway message %d born at %d, outside its send [%d, %d]", s.i, m.BornTimestamp, s.t0, s.t1)
			}
		}
	}
	checkOrdered(t, byMode["ordered"])
	checkDelayed(t, ctx, c, byMode["delay"], stored, delayTopic, delay, brokerAddr)
}

// sentMessages turns a "sent" event (one per message, or per batch) into
// the messages it reports.
func sentMessages(ev javapeer.Event) ([]sentMsg, error) {
	mode := ev.Str("mode")
	if mode != "oneway" && ev.Str("status") != "SEND_OK" {
		return nil, fmt.Errorf("%s send %d: status %s", mode, ev.Int("i"), ev.Str("status"))
	}
	n := 1
	if mode == "batch" {
		n = int(ev.Int("n"))
	}
	if mode == "oneway" {
		return []sentMsg{{mode: mode, i: int(ev.Int("i")), t0: ev.Int("t0"), t1: ev.Int("t1")}}, nil
	}
	if b := ev.Str("broker"); b != testutil.BrokerName {
		return nil, fmt.Errorf("%s send %d: result names broker %q, want %q", mode, ev.Int("i"), b, testutil.BrokerName)
	}
	ids, offIDs, dec := strings.Split(ev.Str("id"), ","), strings.Split(ev.Str("offset_id"), ","), decodedIDs(ev)
	if mode == "tx" && ev["offset_id"] == nil {
		// Java's TransactionSendResult does not copy the offset id.
		return []sentMsg{{mode: mode, i: int(ev.Int("i")), id: ids[0], q: int32(ev.Int("q")), qoff: ev.Int("qoff"), t0: ev.Int("t0"), t1: ev.Int("t1")}}, nil
	}
	if len(ids) != n || len(offIDs) != n || len(dec) != n {
		return nil, fmt.Errorf("%s send %d of %d messages: %d msg ids, %d offset ids, %d decoded: %v", mode, ev.Int("i"), n, len(ids), len(offIDs), len(dec), ev)
	}
	out := make([]sentMsg, n)
	for j := range out {
		if dec[j].err != "" {
			return nil, fmt.Errorf("%s send %d: Java cannot decode offset id %q: %s", mode, ev.Int("i"), offIDs[j], dec[j].err)
		}
		out[j] = sentMsg{mode: mode, i: int(ev.Int("i")) + j, id: ids[j], offsetID: offIDs[j], decoded: dec[j],
			q: int32(ev.Int("q")), qoff: ev.Int("qoff") + int64(j), t0: ev.Int("t0"), t1: ev.Int("t1"), shard: int(ev.Int("shard"))}
	}
	return out, nil
}

// checkStored compares the message runnel's broker stored at the sent
// queue offset with what the Java producer sent and was told.
func checkStored(t *testing.T, s sentMsg, m *protocol.MessageExt, topic, keys, brokerAddr string) {
	t.Helper()
	what := fmt.Sprintf("%s message %d (queue %d offset %d)", s.mode, s.i, s.q, s.qoff)
	if n := javaI(m); n != s.i {
		t.Errorf("%s: the queue offset holds message %d", what, n)
		return
	}
	if want := fmt.Sprintf("%s-%d", topic, s.i); m.Topic != topic || string(m.Body) != want || m.QueueID != s.q {
		t.Errorf("%s: stored topic %q queue %d body %q, want %q %d %q", what, m.Topic, m.QueueID, m.Body, topic, s.q, want)
	}
	if m.Tags() != "TagA" || m.Keys() != keys {
		t.Errorf("%s: tags %q keys %q, want TagA and %q", what, m.Tags(), m.Keys(), keys)
	}
	for k, want := range map[string]string{"color": "blue", "shape": "round", protocol.PropUniqKey: s.id} {
		if got, _ := m.Property(k); got != want {
			t.Errorf("%s: property %s = %q, want %q", what, k, got, want)
		}
	}
	if _, ok := m.Property(protocol.PropDelayLevel); ok {
		t.Errorf("%s: stored with DELAY", what)
	}
	if got := m.OffsetMsgID(); got != s.offsetID {
		t.Errorf("%s: offset id of the stored record %s, the send result said %s", what, got, s.offsetID)
	}
	if s.decoded.addr != brokerAddr || s.decoded.off != m.CommitLogOffset {
		t.Errorf("%s: Java decodes the offset id %s to %s@%d, want the broker %s and the record's commit-log offset %d",
			what, s.offsetID, s.decoded.addr, s.decoded.off, brokerAddr, m.CommitLogOffset)
	}
	if got := m.StoreHost.String(); got != brokerAddr {
		t.Errorf("%s: store host %s, want %s", what, got, brokerAddr)
	}
	if !loopback(m.BornHost.String()) {
		t.Errorf("%s: born host %s, want the producer's 127.0.0.1:port", what, m.BornHost)
	}
	if m.BornTimestamp < s.t0 || m.BornTimestamp > m.StoreTimestamp || m.StoreTimestamp > s.t1 {
		t.Errorf("%s: born %d stored %d, want t0 %d <= born <= stored <= t1 %d", what, m.BornTimestamp, m.StoreTimestamp, s.t0, s.t1)
	}
	if m.ReconsumeTimes != 0 || m.PreparedTransactionOffset != 0 || m.SysFlag != 0 || m.Flag != 0 {
		t.Errorf("%s: reconsume %d prepared %d sysflag %#x flag %d, want zeros", what, m.ReconsumeTimes, m.PreparedTransactionOffset, m.SysFlag, m.Flag)
	}
}

// checkJavaView compares Java's decoding of the record (viewMessage by the
// offset id) with runnel's.
func checkJavaView(t *testing.T, s sentMsg, m *protocol.MessageExt, v javapeer.Event) {
	t.Helper()
	what := fmt.Sprintf("%s message %d", s.mode, s.i)
	if v == nil {
		t.Errorf("%s: no viewMessage result for offset id %s", what, s.offsetID)
		return
	}
	eq := func(field string, got, want any) {
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: Java's viewMessage %s = %v, runnel's pull %v", what, field, got, want)
		}
	}
	eq("topic", v.Str("topic"), m.Topic)
	eq("queue id", v.Int("q"), m.QueueID)
	eq("queue offset", v.Int("qoff"), m.QueueOffset)
	eq("commit-log offset", v.Int("commit_off"), m.CommitLogOffset)
	eq("store size", v.Int("size"), m.StoreSize)
	eq("body CRC", v.Int("body_crc"), m.BodyCRC)
	eq("sysflag", v.Int("sysflag"), m.SysFlag)
	eq("born timestamp", v.Int("born_ts"), m.BornTimestamp)
	eq("born host", v.Str("born_host"), m.BornHost)
	eq("store timestamp", v.Int("store_ts"), m.StoreTimestamp)
	eq("store host", v.Str("store_host"), m.StoreHost)
	eq("body", v.Str("body"), string(m.Body))
	eq("msg id", v.Str("id"), s.id)
	eq("offset msg id", v.Str("offset_id"), s.offsetID)
	eq("tags", v.Str("tags"), m.Tags())
	eq("keys", v.Str("keys"), m.Keys())
	eq("properties", fmt.Sprint(v.Props()), fmt.Sprint(protocol.ParseProperties(m.Properties)))
}

// checkOrdered checks that each shard's messages went to one queue in send
// order.
func checkOrdered(t *testing.T, ordered []sentMsg) {
	t.Helper()
	last := map[int]sentMsg{}
	for _, s := range ordered {
		if p, ok := last[s.shard]; ok && (p.q != s.q || p.qoff >= s.qoff) {
			t.Errorf("shard %d: message %d at %d/%d after message %d at %d/%d", s.shard, s.i, s.q, s.qoff, p.i, p.q, p.qoff)
		}
		last[s.shard] = s
	}
}

// checkDelayed checks the delayed sends: Java's view of the record they
// were stored as (SCHEDULE_TOPIC_XXXX, queue level-1, with REAL_TOPIC and
// REAL_QID), and, once they arrived in their topic, that they arrived no
// earlier than the level's delay after their send, with DELAY removed and
// the born fields kept.
func checkDelayed(t *testing.T, ctx context.Context, c *client.Client, delayed []sentMsg, stored map[string]javapeer.Event, topic string, delay time.Duration, brokerAddr string) {
	t.Helper()
	byI := map[int]sentMsg{}
	for _, s := range delayed {
		byI[s.i] = s
		v := stored[s.offsetID]
		if v == nil {
			t.Errorf("delayed message %d: no viewMessage result for offset id %s", s.i, s.offsetID)
			continue
		}
		p := v.Props()
		if v.Str("topic") != "SCHEDULE_TOPIC_XXXX" || v.Int("q") != 1 || v.Int("qoff") != s.qoff ||
			p["REAL_TOPIC"] != topic || p["REAL_QID"] != strconv.Itoa(int(s.q)) || p["DELAY"] != "2" {
			t.Errorf("delayed message %d (send result queue %d offset %d) viewed as %s/%d/%d with properties %v, want SCHEDULE_TOPIC_XXXX/1/%d with REAL_TOPIC=%s REAL_QID=%d DELAY=2",
				s.i, s.q, s.qoff, v.Str("topic"), v.Int("q"), v.Int("qoff"), p, s.qoff, topic, s.q)
		}
		if s.decoded.addr != brokerAddr || s.decoded.off != v.Int("commit_off") {
			t.Errorf("delayed message %d: Java decodes the offset id to %s@%d, want %s@%d", s.i, s.decoded.addr, s.decoded.off, brokerAddr, v.Int("commit_off"))
		}
	}
	var got []protocol.MessageExt
	testutil.CheckFor(t, 60*time.Second, 100*time.Millisecond, func() error {
		var err error
		got, err = pullTopic(ctx, c, topic)
		if err != nil {
			return err
		}
		if len(got) < len(delayed) {
			return fmt.Errorf("%d of %d delayed messages arrived in %s", len(got), len(delayed), topic)
		}
		return nil
	})
	if len(got) != len(delayed) {
		t.Errorf("%s holds %d messages, want %d", topic, len(got), len(delayed))
	}
	for i := range got {
		m := &got[i]
		s, ok := byI[javaI(m)]
		if !ok {
			t.Errorf("unexpected message %d in %s", javaI(m), topic)
			continue
		}
		what := fmt.Sprintf("delayed message %d", s.i)
		if due := s.t0 + delay.Milliseconds(); m.StoreTimestamp < due {
			t.Errorf("%s arrived at %d, before its delay ended (sent at %d, due %d)", what, m.StoreTimestamp, s.t0, due)
		}
		if m.QueueID != s.q || m.UniqKey() != s.id || string(m.Body) != fmt.Sprintf("%s-%d", topic, s.i) {
			t.Errorf("%s arrived in queue %d with id %s body %q, want queue %d id %s", what, m.QueueID, m.UniqKey(), m.Body, s.q, s.id)
		}
		if m.BornTimestamp < s.t0 || m.BornTimestamp > s.t1 || !loopback(m.BornHost.String()) || m.StoreHost.String() != brokerAddr {
			t.Errorf("%s: born %d at %s, store host %s; want born in [%d, %d] on loopback, stored by %s", what, m.BornTimestamp, m.BornHost, m.StoreHost, s.t0, s.t1, brokerAddr)
		}
		if _, ok := m.Property(protocol.PropDelayLevel); ok {
			t.Errorf("%s arrived with DELAY still set: %q", what, m.Properties)
		}
		if rt, _ := m.Property(protocol.PropRealTopic); rt != topic {
			t.Errorf("%s arrived with REAL_TOPIC %q, want %q (Java keeps it)", what, rt, topic)
		}
		if m.Tags() != "TagA" || m.Keys() != "key-"+strconv.Itoa(s.i) {
			t.Errorf("%s: tags %q keys %q", what, m.Tags(), m.Keys())
		}
	}
}

// protocolTopicMissing reports whether err says the topic has no route
// (yet).
func protocolTopicMissing(err error) bool {
	return errors.Is(err, protocol.ErrTopicNotExist) || errors.Is(err, client.ErrNoRoute)
}
