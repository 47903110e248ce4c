package javatest

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/javapeer"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// TestJavaBrokerRoutes: runnel's admin calls create, update, list and
// delete topics on Apache RocketMQ's broker, and runnel's route lookups and
// cluster info read what the Java name server then knows.
func TestJavaBrokerRoutes(t *testing.T) {
	eachBroker(t, func(t *testing.T, d *javapeer.Dist, c *javapeer.Cluster) {
		ctx := bg(t, 2*time.Minute)
		cl := newJavaClient(t, c)

		ci, err := cl.ClusterInfo(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if names := ci.ClusterAddrTable[c.ClusterName]; !slices.Contains(names, c.BrokerName) {
			t.Fatalf("cluster info: cluster %s has brokers %v, want %s", c.ClusterName, names, c.BrokerName)
		}
		if bd := ci.BrokerAddrTable[c.BrokerName]; bd.Cluster != c.ClusterName || bd.BrokerAddrs[protocol.MasterID] != c.Broker {
			t.Fatalf("cluster info: broker %s is %+v, want master %s in %s", c.BrokerName, bd, c.Broker, c.ClusterName)
		}

		topic := uniqueName(t, "route")
		if _, err := cl.Route(ctx, topic); !errors.Is(err, protocol.ErrTopicNotExist) {
			t.Fatalf("route of a topic nobody created: %v, want TOPIC_NOT_EXIST", err)
		}
		qs := createJavaTopic(t, cl, c, topic, 3)
		r, err := cl.Route(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Data.QueueDatas) != 1 {
			t.Fatalf("route queue datas %+v", r.Data.QueueDatas)
		}
		qd := r.Data.QueueDatas[0]
		if qd.BrokerName != c.BrokerName || qd.ReadQueueNums != 3 || qd.WriteQueueNums != 3 || qd.Perm != protocol.PermRead|protocol.PermWrite {
			t.Fatalf("route queue data %+v", qd)
		}
		if addr, ok := r.MasterAddr(c.BrokerName); !ok || addr != c.Broker {
			t.Fatalf("route master of %s: %q, want %s", c.BrokerName, addr, c.Broker)
		}
		for i, q := range qs {
			if q.Topic != topic || q.BrokerName != c.BrokerName || q.QueueID != int32(i) {
				t.Fatalf("publish queue %d is %s", i, q)
			}
		}
		topics, err := cl.ListTopics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(topics, topic) {
			t.Fatalf("ListTopics lacks %s", topic)
		}

		// Update: more queues, read-only; a refresh sees it, and so does the
		// background route refresh of a client that cached the old route.
		watcher := newJavaClient(t, c, client.WithRouteRefreshInterval(200*time.Millisecond))
		if r, err := watcher.Route(ctx, topic); err != nil || len(r.PublishQueues()) != 3 {
			t.Fatalf("watcher's route: %v", err)
		}
		if err := cl.CreateTopic(ctx, c.Broker, client.TopicConfig{TopicName: topic, ReadQueueNums: 5, WriteQueueNums: 5, Perm: protocol.PermRead}); err != nil {
			t.Fatal(err)
		}
		testutil.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
			r, err := watcher.Route(ctx, topic) // the cache, refreshed in the background
			if err != nil {
				return err
			}
			if len(r.SubscribeQueues()) != 5 || len(r.PublishQueues()) != 0 {
				return fmt.Errorf("watcher's cached route: %d subscribe, %d publish queues, want 5, 0", len(r.SubscribeQueues()), len(r.PublishQueues()))
			}
			return nil
		})
		testutil.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
			r, err := cl.RefreshRoute(ctx, topic)
			if err != nil {
				return err
			}
			if len(r.SubscribeQueues()) != 5 || len(r.PublishQueues()) != 0 {
				return fmt.Errorf("after update: %d subscribe, %d publish queues, want 5, 0", len(r.SubscribeQueues()), len(r.PublishQueues()))
			}
			return nil
		})

		if err := cl.DeleteTopic(ctx, topic, c.ClusterName); err != nil {
			t.Fatal(err)
		}
		testutil.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
			if _, err := cl.RefreshRoute(ctx, topic); !errors.Is(err, protocol.ErrTopicNotExist) {
				return fmt.Errorf("route after delete: %v", err)
			}
			return nil
		})
	})
}

// runnelSent is what a test sent and what the broker answered.
type runnelSent struct {
	msg *client.Message
	res client.SendResult
}

// TestJavaBrokerProduceModes sends with every produce mode of runnel's
// producer to the Java broker and reads everything back with runnel's pull,
// checking field by field what was stored against what was sent and what
// the broker answered: tags, keys, user properties, UNIQ_KEY = msgId,
// offsetMsgId = store host + commit log offset, queue and queue offset,
// flag, born host and time.
func TestJavaBrokerProduceModes(t *testing.T) {
	eachBroker(t, func(t *testing.T, d *javapeer.Dist, c *javapeer.Cluster) {
		ctx := bg(t, 2*time.Minute)
		cl := newJavaClient(t, c)
		topic := uniqueName(t, "modes")
		qs := createJavaTopic(t, cl, c, topic, 4)
		p := newJavaProducer(t, cl, uniqueName(t, "pg"))

		mk := func(mode string, i int) *client.Message {
			return &client.Message{Topic: topic, Body: []byte(fmt.Sprintf("%s-%d", mode, i)), Tags: "tag-" + mode,
				Keys: []string{"k-" + mode + "-" + strconv.Itoa(i), "second"}, Flag: int32(i),
				Properties: map[string]string{"mode": mode, "i": strconv.Itoa(i), "uni": "ünï\tcode"}}
		}
		var sent []runnelSent
		// sync
		for i := range 4 {
			m := mk("sync", i)
			res, err := p.Send(ctx, m)
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != client.SendOK || res.Queue.BrokerName != c.BrokerName || res.BrokerAddr != c.Broker || res.RegionID == "" {
				t.Fatalf("sync result %+v", res)
			}
			sent = append(sent, runnelSent{m, res})
		}
		// async
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i := range 8 {
			m := mk("async", i)
			wg.Add(1)
			p.SendAsync(ctx, func(res client.SendResult, err error) {
				defer wg.Done()
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					t.Errorf("async send %d: %v", i, err)
					return
				}
				sent = append(sent, runnelSent{m, res})
			}, m)
		}
		wg.Wait()
		// batch
		var batch []*client.Message
		for i := range 5 {
			batch = append(batch, mk("batch", i))
		}
		bres, err := p.Send(ctx, batch...)
		if err != nil {
			t.Fatal(err)
		}
		ids, offIDs := strings.Split(bres.MsgID, ","), strings.Split(bres.OffsetMsgID, ",")
		if len(ids) != 5 || len(offIDs) != 5 {
			t.Fatalf("batch result ids %q offset ids %q", bres.MsgID, bres.OffsetMsgID)
		}
		for i, m := range batch {
			r := bres
			r.MsgID, r.OffsetMsgID, r.QueueOffset = ids[i], offIDs[i], bres.QueueOffset+int64(i)
			sent = append(sent, runnelSent{m, r})
		}
		// ordered: HashBySharding puts equal keys in one queue, in order.
		op := newJavaProducer(t, cl, uniqueName(t, "pgo"), client.WithSelector(client.HashBySharding()))
		shardQueue := map[string]int32{}
		for i := range 9 {
			m := mk("ordered", i)
			m.ShardingKey = "shard-" + strconv.Itoa(i%3)
			res, err := op.Send(ctx, m)
			if err != nil {
				t.Fatal(err)
			}
			if q, ok := shardQueue[m.ShardingKey]; ok && q != res.Queue.QueueID {
				t.Fatalf("sharding key %s went to queues %d and %d", m.ShardingKey, q, res.Queue.QueueID)
			}
			shardQueue[m.ShardingKey] = res.Queue.QueueID
			sent = append(sent, runnelSent{m, res})
		}
		// A selector of one's own, and an explicit queue.
		sp := newJavaProducer(t, cl, uniqueName(t, "pgs"), client.WithSelector(client.SelectorFunc(func(m *client.Message, qs []protocol.MessageQueue) protocol.MessageQueue {
			return qs[len(qs)-1]
		})))
		res, err := sp.Send(ctx, mk("selector", 0))
		if err != nil {
			t.Fatal(err)
		}
		if res.Queue.QueueID != 3 {
			t.Fatalf("selector chose the last queue, stored in %s", res.Queue)
		}
		sent = append(sent, runnelSent{mk("selector", 0), res})
		qm := mk("queue", 0)
		qm.Queue = &qs[2]
		res, err = p.Send(ctx, qm)
		if err != nil {
			t.Fatal(err)
		}
		if res.Queue != qs[2] {
			t.Fatalf("explicit queue %s, stored in %s", qs[2], res.Queue)
		}
		sent = append(sent, runnelSent{qm, res})
		// Compressed (a body over the 4 KiB threshold).
		cm := mk("compressed", 0)
		cm.Body = []byte(strings.Repeat("compress me ", 1000))
		res, err = p.Send(ctx, cm)
		if err != nil {
			t.Fatal(err)
		}
		sent = append(sent, runnelSent{cm, res})
		// one-way: no result; found by UNIQ_KEY-less matching below.
		for i := range 3 {
			if err := p.SendOneway(ctx, mk("oneway", i)); err != nil {
				t.Fatal(err)
			}
		}

		group := uniqueName(t, "readback")
		got := pullQueuesTopic(t, cl, qs, group, len(sent)+3, 60*time.Second)
		if len(got) != len(sent)+3 {
			t.Fatalf("read back %d messages, want %d", len(got), len(sent)+3)
		}
		for _, s := range sent {
			m, ok := got[s.res.MsgID]
			if !ok {
				t.Fatalf("message %s (%s) not read back", s.res.MsgID, s.msg.Body)
			}
			checkRunnelStored(t, c, s.msg, s.res, &m)
			delete(got, s.res.MsgID)
		}
		oneway := 0
		for _, m := range got {
			if v, _ := m.Property("mode"); v != "oneway" {
				t.Fatalf("unexpected message %q", m.Body)
			}
			i, _ := m.Property("i")
			n, _ := strconv.Atoi(i)
			checkRunnelStored(t, c, mk("oneway", n), client.SendResult{MsgID: m.UniqKey(), OffsetMsgID: m.OffsetMsgID(),
				Queue: protocol.MessageQueue{Topic: topic, BrokerName: c.BrokerName, QueueID: m.QueueID}, QueueOffset: m.QueueOffset}, &m)
			oneway++
		}
		if oneway != 3 {
			t.Fatalf("%d one-way messages read back, want 3", oneway)
		}
	})
}

// checkRunnelStored compares a message read back from the Java broker with what
// was sent and what the broker's send response said.
func checkRunnelStored(t *testing.T, c *javapeer.Cluster, sent *client.Message, res client.SendResult, m *protocol.MessageExt) {
	t.Helper()
	what := string(sent.Body)
	if len(what) > 40 {
		what = what[:40]
	}
	if m.Topic != sent.Topic || string(m.Body) != string(sent.Body) {
		t.Fatalf("%s: stored topic %q body %q", what, m.Topic, m.Body)
	}
	if m.Tags() != sent.Tags || m.Keys() != strings.Join(sent.Keys, " ") {
		t.Fatalf("%s: stored tags %q keys %q, sent %q %q", what, m.Tags(), m.Keys(), sent.Tags, sent.Keys)
	}
	for k, v := range sent.Properties {
		if got, _ := m.Property(k); got != v {
			t.Fatalf("%s: stored property %s = %q, sent %q (all: %q)", what, k, got, v, m.Properties)
		}
	}
	if m.UniqKey() != res.MsgID || m.MsgID() != res.MsgID {
		t.Fatalf("%s: stored UNIQ_KEY %q, send result msgId %q", what, m.UniqKey(), res.MsgID)
	}
	if m.OffsetMsgID() != res.OffsetMsgID {
		t.Fatalf("%s: stored offset msg id %s, send result offsetMsgId %s", what, m.OffsetMsgID(), res.OffsetMsgID)
	}
	if m.QueueID != res.Queue.QueueID || m.QueueOffset != res.QueueOffset {
		t.Fatalf("%s: stored at %d/%d, send result %s offset %d", what, m.QueueID, m.QueueOffset, res.Queue, res.QueueOffset)
	}
	if m.Flag != sent.Flag {
		t.Fatalf("%s: stored flag %d, sent %d", what, m.Flag, sent.Flag)
	}
	if m.StoreHost.String() != c.Broker {
		t.Fatalf("%s: store host %s, want %s", what, m.StoreHost, c.Broker)
	}
	if !m.BornHost.Addr().IsLoopback() {
		t.Fatalf("%s: born host %s", what, m.BornHost)
	}
	if d := m.StoreTimestamp - m.BornTimestamp; d < -1000 || d > 60_000 {
		t.Fatalf("%s: born %d stored %d", what, m.BornTimestamp, m.StoreTimestamp)
	}
	if sent.ShardingKey != "" {
		if v, _ := m.Property(protocol.PropShardingKeyJava); v != sent.ShardingKey {
			t.Fatalf("%s: stored %s = %q, sent sharding key %q", what, protocol.PropShardingKeyJava, v, sent.ShardingKey)
		}
	}
	if m.Compressed() {
		t.Fatalf("%s: pulled message still marked compressed", what)
	}
}

// TestJavaBrokerDelayAndTimer sends a delay-level message and, on 5.x, the
// three kinds of timer message (TIMER_DELIVER_MS, TIMER_DELAY_SEC,
// TIMER_DELAY_MS) each to a queue of its own, and checks that the Java
// broker holds each back until its time and then delivers it, with its
// properties, to its queue. 4.9 has no timers: there the timer properties
// are stored as they are and the message is visible at once.
func TestJavaBrokerDelayAndTimer(t *testing.T) {
	eachBrokerParallel(t, func(t *testing.T, d *javapeer.Dist, c *javapeer.Cluster) {
		ctx := bg(t, 2*time.Minute)
		cl := newJavaClient(t, c)
		topic := uniqueName(t, "delay")
		qs := createJavaTopic(t, cl, c, topic, 4)
		p := newJavaProducer(t, cl, uniqueName(t, "pg"))
		timers := d.Version != javapeer.Version4
		type kind struct {
			name  string
			msg   *client.Message
			prop  string // the property it carries on the wire
			delay time.Duration
		}
		start := time.Now()
		kinds := []kind{
			{"level", &client.Message{DelayLevel: 1}, protocol.PropDelayLevel, time.Second},
			{"deliver-ms", &client.Message{DeliverTime: start.Add(3 * time.Second)}, protocol.PropTimerDeliverMS, 3 * time.Second},
			{"delay-sec", &client.Message{DeliverAfter: 2 * time.Second}, protocol.PropTimerDelaySec, 2 * time.Second},
			{"delay-ms", &client.Message{DeliverAfter: 2500 * time.Millisecond}, protocol.PropTimerDelayMS, 2500 * time.Millisecond},
		}
		ids := make([]string, len(kinds))
		for i, k := range kinds {
			k.msg.Topic, k.msg.Body, k.msg.Tags, k.msg.Queue = topic, []byte(k.name), "t-"+k.name, &qs[i]
			k.msg.Properties = map[string]string{"kind": k.name}
			res, err := p.Send(ctx, k.msg)
			if err != nil {
				t.Fatalf("%s: %v", k.name, err)
			}
			ids[i] = res.MsgID
		}
		group := uniqueName(t, "g")
		arrived := make([]time.Duration, len(kinds))
		stored := make([]protocol.MessageExt, len(kinds))
		testutil.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
			missing := 0
			for i, q := range qs {
				if arrived[i] != 0 {
					continue
				}
				res, err := cl.Pull(ctx, client.PullRequest{Queue: q, Offset: 0, Group: group})
				if err != nil {
					return err
				}
				if res.Status == client.PullFound {
					arrived[i] = time.Since(start)
					stored[i] = res.Messages[0].Clone()
					continue
				}
				missing++
			}
			if missing > 0 {
				return fmt.Errorf("%d messages not delivered yet (arrived after %v)", missing, arrived)
			}
			return nil
		})
		for i, k := range kinds {
			m := &stored[i]
			t.Logf("%s: delivered after %v, properties %q", k.name, arrived[i].Round(time.Millisecond), strings.ReplaceAll(strings.ReplaceAll(m.Properties, "\x01", "="), "\x02", " "))
			if string(m.Body) != k.name || m.Tags() != "t-"+k.name || m.UniqKey() != ids[i] || m.Topic != topic || m.QueueID != int32(i) {
				t.Fatalf("%s: delivered %q tags %q id %q (want %q) in %s/%d", k.name, m.Body, m.Tags(), m.UniqKey(), ids[i], m.Topic, m.QueueID)
			}
			if v, _ := m.Property("kind"); v != k.name {
				t.Fatalf("%s: user property kind = %q", k.name, v)
			}
			if k.name != "level" && !timers {
				// 4.9: no timer; the property is stored as sent.
				if _, ok := m.Property(k.prop); !ok {
					t.Fatalf("%s: 4.9 stored without %s", k.name, k.prop)
				}
				continue
			}
			// Timers round down to their precision (1 s); level 1 is 1 s.
			if min := k.delay - 1100*time.Millisecond; arrived[i] < min {
				t.Fatalf("%s: delivered after %v, want at least %v", k.name, arrived[i], min)
			}
			// Java keeps the property it was delayed by in the delivered
			// message (ScheduleMessageService.messageTimeUp clears DELAY
			// after it has built the properties string).
			if _, ok := m.Property(k.prop); !ok && k.name == "level" {
				t.Fatalf("%s: delivered without %s", k.name, k.prop)
			}
			if v, _ := m.Property(protocol.PropRealTopic); v != topic {
				t.Fatalf("%s: %s = %q, want %q", k.name, protocol.PropRealTopic, v, topic)
			}
		}
	})
}

// TestJavaBrokerJavaClientAgrees checks runnel's view of stored messages
// against the official Java client's on one Java broker: what runnel's
// producer stored, Java's lite pull consumer reads with the same ids,
// queues, offsets, tags, keys, properties and timestamps as runnel's pull;
// and what Java's producer stored, runnel's pull reads with the msgId,
// offsetMsgId and queue offset Java's send results gave.
func TestJavaBrokerJavaClientAgrees(t *testing.T) {
	eachBroker(t, func(t *testing.T, d *javapeer.Dist, c *javapeer.Cluster) {
		ctx := bg(t, 3*time.Minute)
		cl := newJavaClient(t, c)
		topic := uniqueName(t, "agree")
		qs := createJavaTopic(t, cl, c, topic, 2)
		p := newJavaProducer(t, cl, uniqueName(t, "pg"))
		const n = 8
		var batch []*client.Message
		for i := range n {
			m := &client.Message{Topic: topic, Body: fmt.Appendf(nil, "runnel-%d", i), Tags: "rt", Keys: []string{fmt.Sprintf("rk%d", i)},
				Properties: map[string]string{"i": strconv.Itoa(i), "sp ace": "v a l"}}
			if i == 0 {
				// Over 4 KiB: runnel compresses it (zlib, sysflag type 3).
				m.Body = []byte(strings.Repeat("runnel-0 compressed ", 500))
			}
			if i < n/2 {
				if _, err := p.Send(ctx, m); err != nil {
					t.Fatal(err)
				}
				continue
			}
			batch = append(batch, m)
		}
		if _, err := p.Send(ctx, batch...); err != nil {
			t.Fatal(err)
		}
		ours := pullQueuesTopic(t, cl, qs, uniqueName(t, "g"), n, 30*time.Second)
		if len(ours) != n {
			t.Fatalf("runnel read %d messages back, want %d", len(ours), n)
		}

		dr := d.NewDriver(t)
		evs, err := dr.Run(ctx, c.NameServer, "litepull", "--topic", topic, "--group", uniqueName(t, "jg"),
			"--mode", "assign", "--count", strconv.Itoa(n), "--commit", "none", "--timeout-ms", "60000")
		if err != nil {
			t.Fatal(err)
		}
		seen := 0
		for _, ev := range evs {
			if ev.Kind() == "timeout" {
				t.Fatalf("Java lite pull timed out: %v", ev)
			}
			if ev.Kind() != "recv" {
				continue
			}
			seen++
			m, ok := ours[ev.Str("id")]
			if !ok {
				t.Fatalf("Java read %v, which runnel did not", ev)
			}
			if ev.Str("topic") != m.Topic || ev.Str("broker") != c.BrokerName || ev.Int("q") != int64(m.QueueID) || ev.Int("qoff") != m.QueueOffset ||
				ev.Str("body") != string(m.Body) || ev.Str("tags") != m.Tags() || ev.Str("keys") != m.Keys() ||
				ev.Int("born_ms") != m.BornTimestamp || ev.Int("store_ms") != m.StoreTimestamp || ev.Int("reconsume") != int64(m.ReconsumeTimes) {
				t.Fatalf("Java read %v\nrunnel read %+v", ev, m)
			}
			jp, rp := ev.Props(), protocol.ParseProperties(m.Properties)
			for k, v := range rp {
				if jp[k] != v {
					t.Fatalf("property %q: Java %q, runnel %q", k, jp[k], v)
				}
			}
			for k := range jp {
				if _, ok := rp[k]; !ok && k != "MIN_OFFSET" && k != "MAX_OFFSET" {
					t.Fatalf("Java sees property %q = %q, runnel does not (%q)", k, jp[k], m.Properties)
				}
			}
		}
		if seen != n {
			t.Fatalf("Java read %d messages, want %d", seen, n)
		}

		// The other way: Java's producer, runnel's pull.
		jtopic := uniqueName(t, "agreej")
		jqs := createJavaTopic(t, cl, c, jtopic, 2)
		// Bodies of 6000 bytes: Java compresses them (over 4 KiB).
		sent, err := dr.Run(ctx, c.NameServer, "produce", "--topic", jtopic, "--count", "6", "--tag", "jt", "--keys", "jk", "--prop", "a=b,c=d", "--size", "6000")
		if err != nil {
			t.Fatal(err)
		}
		theirs := pullQueuesTopic(t, cl, jqs, uniqueName(t, "g"), 6, 30*time.Second)
		seen = 0
		for _, ev := range sent {
			if ev.Kind() != "sent" {
				continue
			}
			seen++
			m, ok := theirs[ev.Str("id")]
			if !ok {
				t.Fatalf("Java sent %v; runnel did not read it (read %d)", ev, len(theirs))
			}
			i := ev.Int("i")
			if m.OffsetMsgID() != ev.Str("offset_id") || int64(m.QueueID) != ev.Int("q") || m.QueueOffset != ev.Int("qoff") ||
				m.Tags() != "jt" || m.Keys() != fmt.Sprintf("jk%d", i) || !javaBody(m.Body, fmt.Sprintf("%s-%d", jtopic, i), 6000) {
				t.Fatalf("Java sent %v\nrunnel read %+v (offset id %s)", ev, m, m.OffsetMsgID())
			}
			for k, v := range map[string]string{"a": "b", "c": "d", "javapeer_i": strconv.FormatInt(i, 10)} {
				if got, _ := m.Property(k); got != v {
					t.Fatalf("property %s = %q, want %q", k, got, v)
				}
			}
			// The offset message id names the Java broker's store address
			// and the message's commit log offset.
			host, phys, err := protocol.ParseOffsetMsgID(ev.Str("offset_id"))
			if err != nil || host.String() != c.Broker || phys != m.CommitLogOffset {
				t.Fatalf("offset id %s: %v %d %v; stored at %d", ev.Str("offset_id"), host, phys, err, m.CommitLogOffset)
			}
		}
		if seen != 6 {
			t.Fatalf("%d sent events, want 6", seen)
		}
	})
}

// javaBody reports whether b is the driver's body: prefix padded with '.'
// to size bytes.
func javaBody(b []byte, prefix string, size int) bool {
	return len(b) == size && strings.HasPrefix(string(b), prefix) && strings.Trim(string(b[len(prefix):]), ".") == ""
}
