package broker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil/poll"
	"github.com/runnel-dev/runnel/transport/broker/internal/store"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// shutdown stops b gracefully, failing the test on error.
func shutdown(t testing.TB, b *Broker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

// sameQueues fails unless pulls of every queue of topic answer the same
// bytes on a and b.
func sameQueues(t testing.TB, a, b *Broker, topic string, queues int32) {
	t.Helper()
	ac, bc := dial(t, a.Addr()), dial(t, b.Addr())
	for q := range queues {
		x, y := queueDump(t, ac, topic, q), queueDump(t, bc, topic, q)
		if !bytes.Equal(x, y) {
			t.Fatalf("%s/%d: master returned %d bytes, slave %d, not the same", topic, q, len(x), len(y))
		}
	}
}

// TestBrokerHADivergedSlaveRepaired: an ASYNC master that lost the tail of
// its log (a crash) and wrote other records at those offsets since; its
// slave, which has the lost tail, finds the point where the two logs part
// (epochs), removes its records from there and copies the master's: the
// two give the same answers, never a mix of both histories.
func TestBrokerHADivergedSlaveRepaired(t *testing.T) {
	ns := startNameServer(t)
	mdir, sdir := t.TempDir(), t.TempDir()
	mopts := append([]Option{WithNameServers(ns.Addr()), WithRole(RoleAsyncMaster), WithDataDir(mdir)}, fastHA...)
	sopts := append([]Option{WithNameServers(ns.Addr()), WithRole(RoleSlave), WithBrokerID(1), WithDataDir(sdir)}, fastHA...)
	m := newStartedBroker(t, mopts...)
	s := newStartedBroker(t, sopts...)
	mc := dial(t, m.Addr())
	createTopic(t, mc, "div-t", 1)
	var cut int64
	for i := range 20 {
		rh := send(t, mc, "div-t", 0, []byte(fmt.Sprint("first history ", i)), props(protocol.PropKeys, fmt.Sprint("k", i)))
		if i == 10 {
			_, cut, _ = protocol.ParseOffsetMsgID(rh.MsgID)
		}
	}
	waitCaughtUp(t, m, s)
	shutdown(t, s)
	shutdown(t, m)
	// The master loses its log from message 10 on.
	st, err := store.Open(mdir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.TruncateLog(cut); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	m = startBroker(t, mopts...)
	mc = dial(t, m.Addr())
	for i := range 15 {
		send(t, mc, "div-t", 0, []byte(fmt.Sprint("second history, longer ", i)), props(protocol.PropKeys, fmt.Sprint("k", 10+i)))
	}
	s = startBroker(t, sopts...)
	waitCaughtUp(t, m, s)
	sameQueues(t, m, s, "div-t", 1)
	ml := s.HAStatus().Master
	if ml.Truncations != 1 || ml.LastTruncatedAt != cut {
		t.Fatalf("slave repaired its log %d times, at %d (want once, at %d)", ml.Truncations, ml.LastTruncatedAt, cut)
	}
	sc := dial(t, s.Addr())
	for _, k := range []string{"k12", "k3"} {
		if a, b := queryByKey(t, mc, "div-t", k), queryByKey(t, sc, "div-t", k); a != 1 || b != 1 {
			t.Fatalf("key %s: %d on the master, %d on the slave, want 1 each", k, a, b)
		}
	}
}

// TestBrokerHAResumes: a slave restarted (killed or shut down) goes on
// from its own log end, under load, and a master restarted on another port
// is found again through the name server.
func TestBrokerHAResumes(t *testing.T) {
	ns := startNameServer(t)
	mdir, sdir := t.TempDir(), t.TempDir()
	mopts := append([]Option{WithNameServers(ns.Addr()), WithRole(RoleAsyncMaster), WithDataDir(mdir)}, fastHA...)
	sopts := append([]Option{WithNameServers(ns.Addr()), WithRole(RoleSlave), WithBrokerID(1), WithDataDir(sdir)}, fastHA...)
	m := newStartedBroker(t, mopts...)
	s := newStartedBroker(t, sopts...)
	mc := dial(t, m.Addr())
	createTopic(t, mc, "res-t", 2)

	// Load on the master while the slave is killed and restarted.
	stop := make(chan struct{})
	var sent atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := remoting.Dial(context.Background(), m.Addr())
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			resp, err := c.Invoke(context.Background(), sendReq("res-t", int32(i%2), bytes.Repeat([]byte{'x'}, 200), ""))
			if err != nil || resp.Code != protocol.ResSuccess {
				t.Errorf("send under load: %v %v", err, resp)
				return
			}
			sent.Add(1)
		}
	}()
	poll.Until(t, 10*time.Second, time.Millisecond, func() error {
		if sent.Load() < 300 || s.HAStatus().LogEnd == 0 {
			return errors.New("load starting")
		}
		return nil
	})
	if err := s.Close(); err != nil { // at once, mid-stream
		t.Fatal(err)
	}
	had := s.HAStatus().LogEnd
	s = newStartedBroker(t, sopts...)
	at := sent.Load()
	poll.Until(t, 10*time.Second, time.Millisecond, func() error {
		if sent.Load() < at+300 {
			return errors.New("more load")
		}
		return nil
	})
	close(stop)
	wg.Wait()
	waitCaughtUp(t, m, s)
	if from := s.HAStatus().Master.From; from != had || had == 0 {
		t.Fatalf("the restarted slave's transfer started at %d; it had %d bytes of log: it did not resume", from, had)
	}
	sameQueues(t, m, s, "res-t", 2)

	// The master restarts on another port; the slave follows it.
	shutdown(t, m)
	m = startBroker(t, mopts...)
	mc = dial(t, m.Addr())
	send(t, mc, "res-t", 0, []byte("after the master's restart"), "")
	waitCaughtUp(t, m, s)
	sameQueues(t, m, s, "res-t", 2)
	shutdown(t, s)
}

// TestBrokerHAMetadataSync: a slave copies its master's topic configs,
// subscription groups, consumer offsets and delay offsets, and replays the
// master's topic deletions at their place in the log (a topic deleted and
// created again keeps only its new messages on the slave).
func TestBrokerHAMetadataSync(t *testing.T) {
	delays := WithDelayLevels([]time.Duration{50 * time.Millisecond})
	p := startPair(t, RoleSyncMaster, []Option{delays}, []Option{delays})
	mc, sc := dial(t, p.master.Addr()), dial(t, p.slave.Addr())
	createTopic(t, mc, "meta-t", 4)
	gc := protocol.DefaultSubscriptionGroupConfig("meta-g")
	gc.RetryMaxTimes = 3
	body, err := jsonMarshal(gc)
	if err != nil {
		t.Fatal(err)
	}
	req := protocol.NewRequest(protocol.ReqUpdateAndCreateSubscriptionGroup)
	req.Body = body
	if r := invoke(t, mc, req); r.Code != protocol.ResSuccess {
		t.Fatalf("create group: %d %s", r.Code, r.Remark)
	}
	for i := range 3 {
		send(t, mc, "meta-t", 2, []byte(fmt.Sprint("m", i)), "")
	}
	req = protocol.NewRequest(protocol.ReqUpdateConsumerOffset)
	(&protocol.UpdateConsumerOffsetRequestHeader{ConsumerGroup: "meta-g", Topic: "meta-t", QueueID: 2, CommitOffset: 2}).Encode(req)
	if r := invoke(t, mc, req); r.Code != protocol.ResSuccess {
		t.Fatalf("commit offset: %d %s", r.Code, r.Remark)
	}
	send(t, mc, "meta-t", 1, []byte("delayed"), props(protocol.PropDelayLevel, "1"))
	poll.Until(t, 10*time.Second, 5*time.Millisecond, func() error {
		if r := pull(t, mc, pullArgs{topic: "meta-t", queue: 1, max: 1}); len(r.msgs) != 1 {
			return errors.New("the delayed message is not delivered yet")
		}
		return nil
	})
	masterDelay := invoke(t, mc, protocol.NewRequest(protocol.ReqGetAllDelayOffset))
	var mdw protocol.DelayOffsetSerializeWrapper
	if err := mdw.Decode(masterDelay.Body); err != nil || mdw.OffsetTable[1] != 1 {
		t.Fatalf("master's delay offsets %s (%v), want level 1 at 1", masterDelay.Body, err)
	}
	poll.Until(t, 10*time.Second, 5*time.Millisecond, func() error {
		if tc, ok := p.slave.topics.get("meta-t"); !ok || tc.ReadQueueNums != 4 {
			return fmt.Errorf("slave's topic config %+v", tc)
		}
		if g, ok := (*p.slave.groups.m.Load())["meta-g"]; !ok || g.RetryMaxTimes != 3 {
			return fmt.Errorf("slave's group config %+v", g)
		}
		if off, ok, err := p.slave.store.QueryOffset("meta-g", "meta-t", 2); err != nil || !ok || off != 2 {
			return fmt.Errorf("slave's consumer offset %d %v %v", off, ok, err)
		}
		var sdw protocol.DelayOffsetSerializeWrapper
		if err := sdw.Decode(invoke(t, sc, protocol.NewRequest(protocol.ReqGetAllDelayOffset)).Body); err != nil || sdw.OffsetTable[1] != 1 {
			return fmt.Errorf("slave's delay offsets %v (%v)", sdw.OffsetTable, err)
		}
		return nil
	})
	sameQueues(t, p.master, p.slave, "meta-t", 4)

	// Deleted on the master, created again, one new message.
	req = protocol.NewRequest(protocol.ReqDeleteTopicInBroker)
	(&protocol.DeleteTopicRequestHeader{Topic: "meta-t"}).Encode(req)
	if r := invoke(t, mc, req); r.Code != protocol.ResSuccess {
		t.Fatalf("delete topic: %d %s", r.Code, r.Remark)
	}
	createTopic(t, mc, "meta-t", 4)
	send(t, mc, "meta-t", 2, []byte("reborn"), "")
	waitCaughtUp(t, p.master, p.slave)
	if n, _ := p.slave.store.MaxOffset("meta-t", 2); n != 1 {
		t.Fatalf("slave's queue meta-t/2 ends at %d after the deletion and one new message, want 1", n)
	}
	if n, _ := p.slave.store.MaxOffset("meta-t", 1); n != 0 {
		t.Fatalf("slave's queue meta-t/1 still ends at %d", n)
	}
	poll.Until(t, 10*time.Second, 5*time.Millisecond, func() error {
		if _, ok := p.slave.topics.get("meta-t"); !ok {
			return errors.New("slave has no config of the topic created again")
		}
		return nil
	})
	sameQueues(t, p.master, p.slave, "meta-t", 4)
}

// TestBrokerHAPullSuggest: suggestWhichBrokerId by RocketMQ's rule: a pull
// far behind the log end is sent to the group's slow-consumer broker (1),
// one near it to the master; a slave sends a caught-up consumer back to a
// live master and serves it (long polling, offsets kept) once the master
// is gone.
func TestBrokerHAPullSuggest(t *testing.T) {
	lag := WithSlaveRead(true, 4096)
	p := startPair(t, RoleSyncMaster, []Option{lag}, []Option{lag})
	mc, sc := dial(t, p.master.Addr()), dial(t, p.slave.Addr())
	createTopic(t, mc, "sug-t", 1)
	for i := range 40 {
		send(t, mc, "sug-t", 0, bytes.Repeat([]byte{byte('a' + i%26)}, 512), "")
	}
	waitCaughtUp(t, p.master, p.slave)
	check := func(name string, c *remoting.Conn, a pullArgs, code int32, suggest int64) pullResult {
		t.Helper()
		r := pull(t, c, a)
		if r.code != code || r.h.SuggestWhichBrokerID != suggest {
			t.Fatalf("%s: code %d suggest %d, want code %d suggest %d", name, r.code, r.h.SuggestWhichBrokerID, code, suggest)
		}
		return r
	}
	check("master, far behind", mc, pullArgs{topic: "sug-t", offset: 0, max: 1}, protocol.ResSuccess, 1)
	check("master, near the end", mc, pullArgs{topic: "sug-t", offset: 38, max: 2}, protocol.ResSuccess, 0)
	check("slave, far behind", sc, pullArgs{topic: "sug-t", offset: 0, max: 1}, protocol.ResSuccess, 1)
	check("slave, near the end, master alive", sc, pullArgs{topic: "sug-t", offset: 38, max: 2}, protocol.ResSuccess, 0)
	// At the end, the slave holds the pull as a master would (not Java's
	// RETRY_IMMEDIATELY, which makes clients spin) and sends the consumer
	// back to its master.
	start := time.Now()
	check("slave, at the end, master alive", sc, pullArgs{topic: "sug-t", offset: 40, max: 1,
		sysFlag: protocol.PullFlagSuspend, suspendMS: 300}, protocol.ResPullNotFound, 0)
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Fatalf("the slave answered a pull at its end after %v, not after holding it", d)
	}
	shutdown(t, p.master)
	poll.Until(t, 10*time.Second, 5*time.Millisecond, func() error {
		if p.slave.slave.masterAlive() {
			return errors.New("the slave still hears from its master")
		}
		return nil
	})
	check("slave, master gone", sc, pullArgs{topic: "sug-t", offset: 38, max: 2}, protocol.ResSuccess, 0)
	for _, off := range []int64{40, 45} {
		start = time.Now()
		r := check(fmt.Sprint("slave, master gone, offset ", off), sc, pullArgs{topic: "sug-t", offset: off, max: 1,
			sysFlag: protocol.PullFlagSuspend, suspendMS: 300}, protocol.ResPullNotFound, 0)
		if r.h.NextBeginOffset != off || time.Since(start) < 250*time.Millisecond {
			t.Fatalf("offset %d: next begin %d after %v, want the offset kept after a 300ms hold", off, r.h.NextBeginOffset, time.Since(start))
		}
	}
}

// TestBrokerHAPullSuggestDefaults: with the default lag (the store's memory)
// and with slave read off, masters suggest broker 0; a slave with slave
// read off refuses pulls as a Java 5 slave does.
func TestBrokerHAPullSuggestDefaults(t *testing.T) {
	p := startPair(t, RoleSyncMaster, []Option{WithSlaveRead(false, 1)}, []Option{WithSlaveRead(false, 1)})
	mc, sc := dial(t, p.master.Addr()), dial(t, p.slave.Addr())
	createTopic(t, mc, "sugd-t", 1)
	for range 20 {
		send(t, mc, "sugd-t", 0, bytes.Repeat([]byte{'x'}, 512), "")
	}
	if r := pull(t, mc, pullArgs{topic: "sugd-t", max: 1}); r.code != protocol.ResSuccess || r.h.SuggestWhichBrokerID != 0 {
		t.Fatalf("master without slave read: code %d suggest %d", r.code, r.h.SuggestWhichBrokerID)
	}
	if r := invoke(t, sc, pullRequest(pullArgs{topic: "sugd-t", max: 1})); r.Code != protocol.ResSystemBusy {
		t.Fatalf("slave without slave read: code %d %s, want SYSTEM_BUSY", r.Code, r.Remark)
	}
	q := startPair(t, RoleAsyncMaster, nil, nil)
	qc := dial(t, q.master.Addr())
	createTopic(t, qc, "sugd-t", 1)
	for range 20 {
		send(t, qc, "sugd-t", 0, bytes.Repeat([]byte{'x'}, 512), "")
	}
	if r := pull(t, qc, pullArgs{topic: "sugd-t", max: 1}); r.code != protocol.ResSuccess || r.h.SuggestWhichBrokerID != 0 {
		t.Fatalf("master, 10 KiB behind, default lag: code %d suggest %d", r.code, r.h.SuggestWhichBrokerID)
	}
}

// TestBrokerHATransactionsOnPair: a transaction committed on a SYNC_MASTER
// is on its slave when END_TRANSACTION is answered; the slave's topic never
// shows a half message or a rolled-back one.
func TestBrokerHATransactionsOnPair(t *testing.T) {
	p := startPair(t, RoleSyncMaster, nil, nil)
	mc := subDial(t, p.master, "txp")
	createTopic(t, mc.Conn, "tx-t", 1)
	waitTopic(t, p.slave, "tx-t")
	commit := txSend(t, mc, "txg", "tx-t", 0, "committed")
	rollback := txSend(t, mc, "txg", "tx-t", 0, "rolled back")
	sc := dial(t, p.slave.Addr())
	if r := pull(t, sc, pullArgs{topic: "tx-t", max: 8}); len(r.msgs) != 0 {
		t.Fatalf("the slave shows %d messages of open transactions", len(r.msgs))
	}
	mustEnd(t, mc, "txg", commit, protocol.SysFlagTransactionCommit)
	mustEnd(t, mc, "txg", rollback, protocol.SysFlagTransactionRollback)
	// No wait: the SYNC_MASTER answered once the slave had the commit.
	r := pull(t, sc, pullArgs{topic: "tx-t", max: 8})
	if got := bodies(r.msgs); len(got) != 1 || got[0] != "committed" {
		t.Fatalf("the slave's topic holds %q, want the committed message alone", got)
	}
	sameQueues(t, p.master, p.slave, "tx-t", 1)
}

// TestBrokerHASlaveCutOff: a slave that stops reading does not make the
// master read its backlog ahead (what is in flight is bounded by the socket
// buffers and one transfer batch, whatever the log grows by; the master's
// memory for it is one frame buffer), and a slave
// whose connections are dropped for a while catches up from the store.
func TestBrokerHASlaveCutOff(t *testing.T) {
	var st stall
	var drop atomic.Bool
	dropper := WithHAControl(func(ctx context.Context, off int64, size int) error {
		if drop.Load() {
			return errors.New("connection cut by the test")
		}
		return nil
	})
	// A housekeeping interval longer than the test: a stalled slave sends
	// nothing, and with fastHA's 2 s the master closed its connection when
	// the 200 sends below took longer than that on a loaded machine (the
	// check then found 0 slaves).
	patient := WithHAIntervals(100*time.Millisecond, time.Minute, 32<<10)
	p := startPair(t, RoleAsyncMaster, []Option{patient}, []Option{st.option(), patient})
	mc := dial(t, p.master.Addr())
	createTopic(t, mc, "cut-t", 1)
	st.hold()
	body := bytes.Repeat([]byte{'z'}, 64<<10)
	for range 200 { // 12.5 MiB
		send(t, mc, "cut-t", 0, body, "")
	}
	poll.Until(t, 10*time.Second, 5*time.Millisecond, func() error {
		hs := p.master.HAStatus()
		if len(hs.Slaves) != 1 {
			return fmt.Errorf("%d slaves", len(hs.Slaves))
		}
		sl := hs.Slaves[0]
		inFlight := sl.NextOffset - max(sl.AckOffset, 0)
		if inFlight > 8<<20 {
			t.Fatalf("the master read %d bytes ahead of a slave that does not read (log end %d)", inFlight, hs.LogEnd)
		}
		// What the master holds for the slave is one frame buffer (the
		// 32 KiB batch of fastHA, room for a record), not its lag.
		if sl.BufferBytes <= 0 || sl.BufferBytes > 256<<10 {
			t.Fatalf("the master holds a %d-byte buffer for a slave %d bytes behind", sl.BufferBytes, sl.Lag)
		}
		if hs.LogEnd-sl.NextOffset < 4<<20 {
			return fmt.Errorf("the master's transfer is at %d of %d", sl.NextOffset, hs.LogEnd)
		}
		return nil
	})
	st.release()
	waitCaughtUp(t, p.master, p.slave)

	// Cut off: every connection dropped while the master takes more.
	ns := p.ns
	s2 := startBroker(t, append([]Option{WithNameServers(ns), WithRole(RoleSlave), WithBrokerID(2), dropper}, fastHA...)...)
	drop.Store(true)
	for range 50 {
		send(t, mc, "cut-t", 0, body[:4096], "")
	}
	poll.Until(t, 10*time.Second, 5*time.Millisecond, func() error {
		if ml := s2.HAStatus().Master; ml == nil || ml.LastError == "" {
			return errors.New("the second slave has not been cut yet")
		}
		return nil
	})
	drop.Store(false)
	waitCaughtUp(t, p.master, s2)
	sameQueues(t, p.master, s2, "cut-t", 1)
}

// waitTopic waits until b has a config of topic (a slave copies them).
func waitTopic(t testing.TB, b *Broker, topic string) {
	t.Helper()
	poll.Until(t, 10*time.Second, 5*time.Millisecond, func() error {
		if _, ok := b.topics.get(topic); !ok {
			return fmt.Errorf("no config of %s yet", topic)
		}
		return nil
	})
}

// TestBrokerHATransferRate: GET_BROKER_HA_STATUS reports the bytes per
// second replicated (transferredByteInSecond, on both sides) while a load
// runs, and 0 once it stopped for two seconds.
func TestBrokerHATransferRate(t *testing.T) {
	p := startPair(t, RoleSyncMaster, nil, nil)
	mc, sc := dial(t, p.master.Addr()), dial(t, p.slave.Addr())
	createTopic(t, mc, "rate-t", 1)
	rates := func() (int64, int64) {
		var mi, si protocol.HARuntimeInfo
		if err := mi.Decode(invoke(t, mc, protocol.NewRequest(protocol.ReqGetBrokerHAStatus)).Body); err != nil || len(mi.HAConnectionInfo) != 1 {
			t.Fatalf("master's HA status %+v: %v", mi, err)
		}
		if err := si.Decode(invoke(t, sc, protocol.NewRequest(protocol.ReqGetBrokerHAStatus)).Body); err != nil {
			t.Fatal(err)
		}
		return mi.HAConnectionInfo[0].TransferredByteInSecond, si.HAClientRuntimeInfo.TransferredByteInSecond
	}
	body := bytes.Repeat([]byte{'r'}, 1024)
	poll.Until(t, 20*time.Second, time.Millisecond, func() error {
		send(t, mc, "rate-t", 0, body, "")
		if m, s := rates(); m <= 0 || s <= 0 {
			return fmt.Errorf("rates %d/s sent, %d/s received", m, s)
		}
		return nil
	})
	m, s := rates()
	if sent, got := p.master.HAStatus().Slaves[0].BytesSent, p.slave.HAStatus().Master.BytesReceived; m > sent || s > got || sent < got {
		t.Fatalf("rates %d/s and %d/s; %d bytes sent, %d received", m, s, sent, got)
	}
	poll.Until(t, 20*time.Second, 50*time.Millisecond, func() error {
		if m, s := rates(); m != 0 || s != 0 {
			return fmt.Errorf("rates %d/s and %d/s without load", m, s)
		}
		return nil
	})
}

// TestBrokerHAScheduleRetryOnPair: delay-level and timer messages, retries
// and dead letters on a SYNC_MASTER pair. A scheduled message answered
// SEND_OK is in the slave's log when the answer comes; only the master
// delivers it (the slave does not, even with its master gone), and what
// the master delivers, retries and dead-letters is on the slave at the
// same queue offsets.
func TestBrokerHAScheduleRetryOnPair(t *testing.T) {
	// Level 2 is long enough that the slave can be read before it is due
	// on a loaded machine; the retries (level 3 on) and the last part's
	// level 1 are short.
	levels := WithDelayLevels([]time.Duration{150 * time.Millisecond, 2 * time.Second, 150 * time.Millisecond, 150 * time.Millisecond})
	p := startPair(t, RoleSyncMaster, []Option{levels}, []Option{levels})
	mc, sc := dial(t, p.master.Addr()), dial(t, p.slave.Addr())
	createTopic(t, mc, "sched-t", 1)
	waitTopic(t, p.slave, "sched-t")
	onSlave := func(rh protocol.SendMessageResponseHeader) {
		t.Helper()
		_, phys, err := protocol.ParseOffsetMsgID(rh.MsgID)
		if err != nil {
			t.Fatal(err)
		}
		if end := p.slave.HAStatus().LogEnd; end <= phys {
			t.Fatalf("SEND_OK for physical offset %d; the slave's log ends at %d", phys, end)
		}
	}
	sent := time.Now()
	onSlave(send(t, mc, "sched-t", 0, []byte("delayed"), props(protocol.PropDelayLevel, "2")))
	onSlave(send(t, mc, "sched-t", 0, []byte("timer"), props(protocol.PropTimerDelayMS, "2000")))
	r := pull(t, sc, pullArgs{topic: "sched-t", max: 8})
	if early := time.Since(sent) < 2*time.Second; early && len(r.msgs) != 0 {
		t.Fatalf("the slave shows %d scheduled messages before they are due", len(r.msgs))
	} else if !early {
		t.Logf("the slave was read %v after the sends, past the delay: not checked before due", time.Since(sent).Round(time.Millisecond))
	}
	poll.Until(t, 15*time.Second, 10*time.Millisecond, func() error {
		if r := pull(t, mc, pullArgs{topic: "sched-t", max: 8}); len(r.msgs) != 2 {
			return fmt.Errorf("the master delivered %d of 2 scheduled messages", len(r.msgs))
		}
		return nil
	})
	waitCaughtUp(t, p.master, p.slave)
	sameQueues(t, p.master, p.slave, "sched-t", 1)

	// A retry, then a dead letter (the group retries once).
	gc := protocol.DefaultSubscriptionGroupConfig("sched-g")
	gc.RetryMaxTimes = 1
	body, err := jsonMarshal(gc)
	if err != nil {
		t.Fatal(err)
	}
	req := protocol.NewRequest(protocol.ReqUpdateAndCreateSubscriptionGroup)
	req.Body = body
	if r := invoke(t, mc, req); r.Code != protocol.ResSuccess {
		t.Fatalf("create group: %d %s", r.Code, r.Remark)
	}
	first := pull(t, mc, pullArgs{group: "sched-g", topic: "sched-t", max: 1}).msgs[0]
	if r := invoke(t, mc, sendBackReq("sched-g", first.CommitLogOffset, 0)); r.Code != protocol.ResSuccess {
		t.Fatalf("send back: %d %s", r.Code, r.Remark)
	}
	rt, dlq := retryTopic("sched-g"), dlqTopic("sched-g")
	var retried protocol.MessageExt
	poll.Until(t, 15*time.Second, 10*time.Millisecond, func() error {
		r := pull(t, mc, pullArgs{group: "sched-g", topic: rt, max: 1})
		if len(r.msgs) != 1 {
			return errors.New("the retry is not delivered yet")
		}
		retried = r.msgs[0]
		return nil
	})
	if r := invoke(t, mc, sendBackReq("sched-g", retried.CommitLogOffset, 0)); r.Code != protocol.ResSuccess {
		t.Fatalf("send back of the retry: %d %s", r.Code, r.Remark)
	}
	poll.Until(t, 15*time.Second, 10*time.Millisecond, func() error {
		if r := pull(t, sc, pullArgs{group: "sched-g", topic: dlq, max: 1}); len(r.msgs) != 1 || string(r.msgs[0].Body) != string(first.Body) {
			return errors.New("the dead letter is not on the slave yet")
		}
		return nil
	})
	waitCaughtUp(t, p.master, p.slave)
	sameQueues(t, p.master, p.slave, rt, 1)
	sameQueues(t, p.master, p.slave, dlq, 1)

	// Due while the master is gone: the slave does not deliver it.
	onSlave(send(t, mc, "sched-t", 0, []byte("late"), props(protocol.PropDelayLevel, "1")))
	shutdown(t, p.master)
	time.Sleep(600 * time.Millisecond) // four times the delay: a slave that delivered would have
	if r := pull(t, sc, pullArgs{topic: "sched-t", max: 8}); len(r.msgs) != 2 {
		t.Fatalf("the slave's topic holds %d messages with its master gone, want the 2 the master delivered", len(r.msgs))
	}
}
