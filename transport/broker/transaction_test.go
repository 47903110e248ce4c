package broker

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil/cputime"
	"github.com/runnel-dev/runnel/transport/broker/internal/store"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// txHalf is what a transactional send was answered with.
type txHalf struct {
	queueID     int32
	queueOffset int64
	phys        int64
	msgID       string
	txID        string
}

// txSend sends a transactional half message the way the Go transaction
// producer does (sysFlag 4, TRAN_MSG, PGROUP).
func txSend(t testing.TB, c *subClient, group, topic string, queue int32, body string, extra ...string) txHalf {
	t.Helper()
	resp := c.invoke(t, txSendReq(group, topic, queue, body, extra...))
	if resp.Code != protocol.ResSuccess {
		t.Fatalf("transactional send: %d %q", resp.Code, resp.Remark)
	}
	var rh protocol.SendMessageResponseHeader
	if err := rh.Decode(resp); err != nil {
		t.Fatal(err)
	}
	_, phys, err := protocol.ParseOffsetMsgID(rh.MsgID)
	if err != nil {
		t.Fatalf("send response msgId %q is not an offset id: %v", rh.MsgID, err)
	}
	return txHalf{queueID: rh.QueueID, queueOffset: rh.QueueOffset, phys: phys, msgID: rh.MsgID, txID: rh.TransactionID}
}

func txSendReq(group, topic string, queue int32, body string, extra ...string) *protocol.Command {
	kv := append([]string{protocol.PropTransactionPrepared, "true", protocol.PropProducerGroup, group, protocol.PropTags, "tx"}, extra...)
	req := protocol.NewRequest(protocol.ReqSendMessage)
	h := protocol.SendMessageRequestHeader{
		ProducerGroup: group, Topic: topic, DefaultTopic: topicDefault, DefaultTopicQueueNums: 4,
		QueueID: queue, SysFlag: protocol.SysFlagTransactionPrepared, BornTimestamp: time.Now().UnixMilli(),
		Properties: props(kv...), ReconsumeTimes: protocol.Some[int32](0), UnitMode: protocol.Some(false),
		Batch: protocol.Some(false),
	}
	h.Encode(req)
	req.Body = []byte(body)
	return req
}

func endReq(group string, h txHalf, state int32, fromCheck bool) *protocol.Command {
	req := protocol.NewRequest(protocol.ReqEndTransaction)
	eh := protocol.EndTransactionRequestHeader{
		ProducerGroup: group, TranStateTableOffset: h.queueOffset, CommitLogOffset: h.phys,
		CommitOrRollback: state, FromTransactionCheck: protocol.Some(fromCheck), MsgID: h.txID,
		TransactionID: h.txID, BrokerName: DefaultBrokerName,
	}
	eh.Encode(req)
	return req
}

// endTx sends END_TRANSACTION and returns the response.
func endTx(t testing.TB, c *subClient, group string, h txHalf, state int32) *protocol.Command {
	t.Helper()
	return c.invoke(t, endReq(group, h, state, false))
}

func mustEnd(t testing.TB, c *subClient, group string, h txHalf, state int32) {
	t.Helper()
	if resp := endTx(t, c, group, h, state); resp.Code != protocol.ResSuccess {
		t.Fatalf("end transaction %d: %d %q", state, resp.Code, resp.Remark)
	}
}

func bodies(ms []protocol.MessageExt) []string {
	out := make([]string, len(ms))
	for i := range ms {
		out[i] = string(ms[i].Body)
	}
	return out
}

// txBroker starts a broker whose check-back runs every 20 ms.
func txBroker(t *testing.T, dir string, clk *subClock, opts ...Option) *Broker {
	t.Helper()
	return subBroker(t, dir, clk, append([]Option{WithTransactionCheckInterval(20 * time.Millisecond)}, opts...)...)
}

func TestBrokerTransactionCommit(t *testing.T) {
	subLeakCheck(t)
	clk := &subClock{}
	b := txBroker(t, t.TempDir(), clk)
	c := subDial(t, b, "producer-1")
	h := txSend(t, c, "txpg", "TxTopic", 2, "hello", protocol.PropKeys, "k1")
	if h.queueID != 2 || h.queueOffset != 0 || h.txID == "" {
		t.Fatalf("half response %+v", h)
	}
	halves := subMessages(t, b, topicTransHalf, 0)
	if len(halves) != 1 {
		t.Fatalf("half queue holds %d", len(halves))
	}
	hm := &halves[0]
	if hm.CommitLogOffset != h.phys || protocol.TransactionType(hm.SysFlag) != protocol.SysFlagTransactionNotType {
		t.Errorf("half message phys %d sysFlag %#x", hm.CommitLogOffset, hm.SysFlag)
	}
	wantProps(t, hm, protocol.PropRealTopic, "TxTopic", protocol.PropRealQueueID, "2", protocol.PropTransactionID, h.txID,
		protocol.PropProducerGroup, "txpg", protocol.PropTransactionPrepared, "true", protocol.PropUniqKey, h.txID)

	// Invisible to a consumer of the real topic.
	if r := pull(t, c.Conn, pullArgs{topic: "TxTopic", queue: 2, max: 32}); len(r.msgs) != 0 {
		t.Fatalf("pull before commit returned %d messages", len(r.msgs))
	}
	mustEnd(t, c, "txpg", h, protocol.SysFlagTransactionCommit)
	r := pull(t, c.Conn, pullArgs{topic: "TxTopic", queue: 2, max: 32})
	if len(r.msgs) != 1 || string(r.msgs[0].Body) != "hello" {
		t.Fatalf("pull after commit: %q", bodies(r.msgs))
	}
	m := &r.msgs[0]
	if protocol.TransactionType(m.SysFlag) != protocol.SysFlagTransactionCommit || m.PreparedTransactionOffset != h.phys {
		t.Errorf("committed sysFlag %#x preparedTransactionOffset %d (half at %d)", m.SysFlag, m.PreparedTransactionOffset, h.phys)
	}
	wantProps(t, m, protocol.PropTransactionPrepared, "", protocol.PropRealTopic, "", protocol.PropRealQueueID, "",
		protocol.PropProducerGroup, "txpg", protocol.PropUniqKey, h.txID, protocol.PropKeys, "k1", protocol.PropTags, "tx")

	// Repeated commits, also from a check, are answered success and store nothing.
	mustEnd(t, c, "txpg", h, protocol.SysFlagTransactionCommit)
	if resp := c.invoke(t, endReq("txpg", h, protocol.SysFlagTransactionCommit, true)); resp.Code != protocol.ResSuccess {
		t.Fatalf("repeated commit from check: %d %q", resp.Code, resp.Remark)
	}
	if got := subMessages(t, b, "TxTopic", 2); len(got) != 1 {
		t.Fatalf("TxTopic/2 holds %d after repeated commits", len(got))
	}
	// A rollback of a committed transaction is refused.
	if resp := endTx(t, c, "txpg", h, protocol.SysFlagTransactionRollback); resp.Code != protocol.ResSystemError {
		t.Errorf("rollback after commit: %d %q", resp.Code, resp.Remark)
	}
	if st := b.TransactionStats(); st.Prepared != 1 || st.Committed != 1 || st.RolledBack != 0 {
		t.Errorf("stats %+v", st)
	}
	// The inline commit wrote no op record and no commit key: the final
	// message is found by its UNIQ_KEY, and the outcome lookup through the
	// store (the path after a restart) finds it there.
	if ops := subMessages(t, b, topicTransOpHalf, 0); len(ops) != 0 {
		t.Fatalf("op records %q after an inline commit", bodies(ops))
	}
	recs, err := b.store.QueryByKey("TxTopic", commitKey(h.queueOffset), 4, 0, math.MaxInt64)
	if err != nil || len(recs) != 0 {
		t.Fatalf("final messages under the commit key: %d (%v), want none", len(recs), err)
	}
	for _, k := range []string{h.txID, "k1"} {
		recs, err := b.store.QueryByKey("TxTopic", k, 4, 0, math.MaxInt64)
		if err != nil || len(recs) != 1 {
			t.Fatalf("final messages under key %q: %d (%v)", k, len(recs), err)
		}
		// The half message is not indexed.
		if recs, err := b.store.QueryByKey(topicTransHalf, k, 4, 0, math.MaxInt64); err != nil || len(recs) != 0 {
			t.Fatalf("half messages under key %q: %d (%v), want none", k, len(recs), err)
		}
	}
	b.tx.mu.Lock()
	if i := h.queueOffset - b.tx.mu.endedBase; i >= 0 && i < int64(len(b.tx.mu.ended)) {
		b.tx.mu.ended[i] = txPending
	}
	b.tx.mu.pendingFrom = math.MaxInt64 // outcome unknown in memory
	b.tx.mu.Unlock()
	if st, err := b.tx.state(hm); err != nil || st != txCommitted {
		t.Fatalf("state through the store: %v (%v), want commit", st, err)
	}
}

// TestBrokerTransactionCommitKeysFull: a final message that already has
// the maximum number of index keys gets an op record instead of the commit
// key, indexed (the final message's keys do not count against the op
// record's), and its outcome is found after a restart.
func TestBrokerTransactionCommitKeysFull(t *testing.T) {
	subLeakCheck(t)
	clk := &subClock{}
	dir := t.TempDir()
	b := txBroker(t, dir, clk)
	c := subDial(t, b, "producer-1")
	keys := make([]string, store.MaxKeysPerMessage)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
	}
	h := txSend(t, c, "txpg", "TxTopic", 0, "many keys", protocol.PropKeys, strings.Join(keys, " "))
	mustEnd(t, c, "txpg", h, protocol.SysFlagTransactionCommit)
	if n := b.tx.inlineEnds.Load(); n != 1 {
		t.Errorf("%d inline ends, want 1", n)
	}
	ops := subMessages(t, b, topicTransOpHalf, 0)
	if len(ops) != 1 || string(ops[0].Body) != "0," {
		t.Fatalf("op records %q", bodies(ops))
	}
	wantProps(t, &ops[0], protocol.PropTags, "d", propTxState, "commit")
	reopenCommitted(t, b, dir, clk, h)
}

// TestBrokerTransactionCommitKeyFallback: a half message whose UNIQ_KEY
// cannot be indexed (longer than the store allows) commits with the commit
// key instead; after a restart (outcome read from the store) a repeated
// commit stores nothing and a rollback is refused. A half message that
// shares its UNIQ_KEY with more committed messages than QUERY_MESSAGE
// returns is still found committed.
func TestBrokerTransactionCommitKeyFallback(t *testing.T) {
	subLeakCheck(t)
	clk := &subClock{}
	dir := t.TempDir()
	b := txBroker(t, dir, clk)
	c := subDial(t, b, "producer-1")
	long := strings.Repeat("u", store.MaxNameLen+1)
	h := txSend(t, c, "txpg", "TxTopic", 0, "long uniq", protocol.PropUniqKey, long)
	mustEnd(t, c, "txpg", h, protocol.SysFlagTransactionCommit)
	if ops := subMessages(t, b, topicTransOpHalf, 0); len(ops) != 0 {
		t.Fatalf("op records %q", bodies(ops))
	}
	recs, err := b.store.QueryByKey("TxTopic", commitKey(h.queueOffset), 4, 0, math.MaxInt64)
	if err != nil || len(recs) != 1 {
		t.Fatalf("final messages under the commit key: %d (%v)", len(recs), err)
	}
	// Many committed messages under one UNIQ_KEY, the one to find last.
	var dups []txHalf
	for i := range store.MaxQueryNum + 2 {
		dups = append(dups, txSend(t, c, "txpg", "DupTopic", 0, "dup"+strconv.Itoa(i), protocol.PropUniqKey, "same-uniq"))
	}
	for _, d := range dups[:len(dups)-1] {
		mustEnd(t, c, "txpg", d, protocol.SysFlagTransactionCommit)
	}
	last := dups[len(dups)-1]
	b, c = reopenCommitted(t, b, dir, clk, h)
	// The first duplicate's outcome is below QUERY_MESSAGE's cap of newest
	// records once the last one is committed too.
	mustEnd(t, c, "txpg", last, protocol.SysFlagTransactionCommit)
	mustEnd(t, c, "txpg", dups[0], protocol.SysFlagTransactionCommit)
	mustEnd(t, c, "txpg", last, protocol.SysFlagTransactionCommit)
	if resp := endTx(t, c, "txpg", dups[0], protocol.SysFlagTransactionRollback); resp.Code != protocol.ResSystemError {
		t.Errorf("rollback of the first duplicate after commit: %d %q", resp.Code, resp.Remark)
	}
	if got := subMessages(t, b, "DupTopic", 0); len(got) != len(dups) {
		t.Fatalf("DupTopic/0 holds %d, want %d", len(got), len(dups))
	}
}

// reopenCommitted closes b and starts the broker again on dir (the
// outcome of h, a committed half message on TxTopic/0, is then read from
// the store): a repeated commit stores nothing, a rollback is refused and
// TxTopic/0 holds one message. It returns the new broker and a client.
func reopenCommitted(t *testing.T, b *Broker, dir string, clk *subClock, h txHalf) (*Broker, *subClient) {
	t.Helper()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b = txBroker(t, dir, clk)
	c := subDial(t, b, "producer-2")
	mustEnd(t, c, "txpg", h, protocol.SysFlagTransactionCommit)
	if resp := endTx(t, c, "txpg", h, protocol.SysFlagTransactionRollback); resp.Code != protocol.ResSystemError {
		t.Errorf("rollback after commit, after a restart: %d %q", resp.Code, resp.Remark)
	}
	if got := subMessages(t, b, "TxTopic", 0); len(got) != 1 {
		t.Fatalf("TxTopic/0 holds %q", bodies(got))
	}
	return b, c
}

func TestBrokerTransactionRollback(t *testing.T) {
	subLeakCheck(t)
	clk := &subClock{}
	b := txBroker(t, t.TempDir(), clk)
	c := subDial(t, b, "producer-1")
	h := txSend(t, c, "txpg", "TxTopic", 0, "discard me")
	mustEnd(t, c, "txpg", h, protocol.SysFlagTransactionRollback)
	mustEnd(t, c, "txpg", h, protocol.SysFlagTransactionRollback)
	if got := subMessages(t, b, "TxTopic", 0); len(got) != 0 {
		t.Fatalf("rolled back message visible: %q", bodies(got))
	}
	if resp := endTx(t, c, "txpg", h, protocol.SysFlagTransactionCommit); resp.Code != protocol.ResSystemError {
		t.Errorf("commit after rollback: %d %q", resp.Code, resp.Remark)
	}
	if got := subMessages(t, b, "TxTopic", 0); len(got) != 0 {
		t.Fatalf("rolled back message visible after a late commit: %q", bodies(got))
	}
	if ops := subMessages(t, b, topicTransOpHalf, 0); len(ops) != 1 {
		t.Errorf("%d op records, want 1", len(ops))
	}
	if st := b.TransactionStats(); st.RolledBack != 1 || st.Committed != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestBrokerTransactionUnknownGetsNoResponse(t *testing.T) {
	subLeakCheck(t)
	clk := &subClock{}
	b := txBroker(t, t.TempDir(), clk)
	c := subDial(t, b, "producer-1")
	h := txSend(t, c, "txpg", "TxTopic", 0, "later")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := c.Invoke(ctx, endReq("txpg", h, protocol.SysFlagTransactionNotType, false))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("END_TRANSACTION unknown was answered (err %v)", err)
	}
	// The connection stays usable and the half message pending.
	mustEnd(t, c, "txpg", h, protocol.SysFlagTransactionCommit)
	if got := subMessages(t, b, "TxTopic", 0); len(got) != 1 {
		t.Fatalf("TxTopic/0 holds %d", len(got))
	}
}

func TestBrokerTransactionMismatch(t *testing.T) {
	subLeakCheck(t)
	clk := &subClock{}
	b := txBroker(t, t.TempDir(), clk)
	c := subDial(t, b, "producer-1")
	h := txSend(t, c, "txpg", "TxTopic", 0, "a")
	h2 := txSend(t, c, "txpg", "TxTopic", 0, "b")
	plain := c.send(t, protocol.ReqSendMessage, "TxTopic", 1, "plain", nil, 0, 0)
	plainID, _ := plain.Ext("msgId")
	_, plainPhys, err := protocol.ParseOffsetMsgID(plainID)
	if err != nil {
		t.Fatal(err)
	}
	wrongOff := h
	wrongOff.queueOffset = h2.queueOffset
	notHalf := h
	notHalf.phys = plainPhys
	nowhere := h
	nowhere.phys = 1 << 40
	for _, tc := range []struct {
		name, group string
		h           txHalf
		remark      string
	}{
		{"wrong group", "other", h, remarkWrongGroup},
		{"wrong state table offset", "txpg", wrongOff, remarkWrongStateOff},
		{"not a half message", "txpg", notHalf, remarkHalfNotFound},
		{"no message", "txpg", nowhere, remarkHalfNotFound},
	} {
		for _, st := range []int32{protocol.SysFlagTransactionCommit, protocol.SysFlagTransactionRollback} {
			resp := endTx(t, c, tc.group, tc.h, st)
			if resp.Code != protocol.ResSystemError || resp.Remark != tc.remark {
				t.Errorf("%s (%d): %d %q, want SYSTEM_ERROR %q", tc.name, st, resp.Code, resp.Remark, tc.remark)
			}
		}
	}
	if got := subMessages(t, b, "TxTopic", 0); len(got) != 0 {
		t.Fatalf("mismatched ends stored %q", bodies(got))
	}
	if ops := subMessages(t, b, topicTransOpHalf, 0); len(ops) != 0 {
		t.Fatalf("mismatched ends wrote %d op records", len(ops))
	}
	// A missing required field is INVALID_PARAMETER.
	req := protocol.NewRequest(protocol.ReqEndTransaction)
	req.SetExt("producerGroup", "txpg")
	if resp := c.invoke(t, req); resp.Code != protocol.ResInvalidParameter {
		t.Errorf("header without offsets: %d %q", resp.Code, resp.Remark)
	}
	mustEnd(t, c, "txpg", h, protocol.SysFlagTransactionCommit)
}

func TestBrokerTransactionConcurrentCommits(t *testing.T) {
	subLeakCheck(t)
	clk := &subClock{}
	b := txBroker(t, t.TempDir(), clk)
	c := subDial(t, b, "producer-1")
	const n = 20
	hs := make([]txHalf, n)
	for i := range hs {
		hs[i] = txSend(t, c, "txpg", "TxTopic", 0, "m"+strconv.Itoa(i))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errc := make(chan error, 4*n)
	for i := range hs {
		for range 4 {
			go func() {
				resp, err := c.Invoke(ctx, endReq("txpg", hs[i], protocol.SysFlagTransactionCommit, false))
				if err == nil && resp.Code != protocol.ResSuccess {
					err = fmt.Errorf("commit %d: %d %q", i, resp.Code, resp.Remark)
				}
				errc <- err
			}()
		}
	}
	for range 4 * n {
		if err := <-errc; err != nil {
			t.Error(err)
		}
	}
	if got := subMessages(t, b, "TxTopic", 0); len(got) != n {
		t.Fatalf("TxTopic/0 holds %d after concurrent commits, want %d", len(got), n)
	}
	if st := b.TransactionStats(); st.Committed != n {
		t.Errorf("committed %d", st.Committed)
	}
}

func TestBrokerTransactionRestart(t *testing.T) {
	subLeakCheck(t)
	clk := &subClock{}
	dir := t.TempDir()
	b := txBroker(t, dir, clk)
	c := subDial(t, b, "producer-1")
	committed := txSend(t, c, "txpg", "TxTopic", 0, "committed")
	rolledBack := txSend(t, c, "txpg", "TxTopic", 0, "rolled back")
	pending := txSend(t, c, "txpg", "TxTopic", 0, "pending")
	mustEnd(t, c, "txpg", committed, protocol.SysFlagTransactionCommit)
	mustEnd(t, c, "txpg", rolledBack, protocol.SysFlagTransactionRollback)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	b = txBroker(t, dir, clk)
	c = subDial(t, b, "producer-2")
	// Repeats after the restart change nothing; the pending one commits.
	mustEnd(t, c, "txpg", committed, protocol.SysFlagTransactionCommit)
	mustEnd(t, c, "txpg", rolledBack, protocol.SysFlagTransactionRollback)
	if resp := endTx(t, c, "txpg", committed, protocol.SysFlagTransactionRollback); resp.Code != protocol.ResSystemError {
		t.Errorf("rollback of a committed transaction after restart: %d", resp.Code)
	}
	if got := bodies(subMessages(t, b, "TxTopic", 0)); len(got) != 1 || got[0] != "committed" {
		t.Fatalf("after restart TxTopic/0 holds %q", got)
	}
	mustEnd(t, c, "txpg", pending, protocol.SysFlagTransactionCommit)
	mustEnd(t, c, "txpg", pending, protocol.SysFlagTransactionCommit)
	if got := bodies(subMessages(t, b, "TxTopic", 0)); len(got) != 2 || got[1] != "pending" {
		t.Fatalf("after the late commit TxTopic/0 holds %q", got)
	}
	if st := b.TransactionStats(); st.Committed != 1 || st.RolledBack != 0 {
		t.Errorf("stats after restart %+v (repeats must not count)", st)
	}
}

// txProducer heartbeats as a member of a producer group and reports the
// check-backs it receives.
func txProducer(t *testing.T, b *Broker, clientID, group string) *subClient {
	t.Helper()
	c := subDial(t, b, clientID)
	if resp := c.heartbeat(t, "", group); resp.Code != protocol.ResSuccess {
		t.Fatalf("heartbeat: %d %q", resp.Code, resp.Remark)
	}
	return c
}

// checkOf decodes a CHECK_TRANSACTION_STATE request.
func checkOf(t testing.TB, req *protocol.Command) (protocol.CheckTransactionStateRequestHeader, protocol.MessageExt) {
	t.Helper()
	var h protocol.CheckTransactionStateRequestHeader
	if err := h.Decode(req); err != nil {
		t.Fatalf("check header: %v", err)
	}
	m, n, err := protocol.DecodeRecord(req.Body)
	if err != nil || n != len(req.Body) {
		t.Fatalf("check body: %v (%d of %d bytes)", err, n, len(req.Body))
	}
	return h, m.Clone()
}

func TestBrokerTransactionCheckBack(t *testing.T) {
	subLeakCheck(t)
	clk := &subClock{}
	b := txBroker(t, t.TempDir(), clk)
	p := txProducer(t, b, "producer-1", "txpg")
	other := txProducer(t, b, "producer-2", "otherpg")
	h := txSend(t, p, "txpg", "TxTopic", 3, "check me", "userProp", "v")
	// Younger than the transaction timeout (6 s): not checked.
	subNever(t, 200*time.Millisecond, func() bool { return len(p.requests(protocol.ReqCheckTransactionState)) > 0 }, "check-back before the timeout")
	clk.advance(7 * time.Second)
	subEventually(t, 5*time.Second, func() error {
		if n := len(p.requests(protocol.ReqCheckTransactionState)); n == 0 {
			return errors.New("no check-back")
		}
		return nil
	})
	req := p.requests(protocol.ReqCheckTransactionState)[0]
	if !req.IsOneway() {
		t.Error("check-back is not oneway")
	}
	ch, m := checkOf(t, req)
	if ch.TranStateTableOffset != h.queueOffset || ch.CommitLogOffset != h.phys || ch.MsgID != h.txID ||
		ch.TransactionID != h.txID || ch.OffsetMsgID != h.msgID || ch.Topic != topicTransHalf || ch.BrokerName != DefaultBrokerName {
		t.Errorf("check header %+v, half %+v", ch, h)
	}
	if m.Topic != "TxTopic" || m.QueueID != 3 || string(m.Body) != "check me" || m.QueueOffset != h.queueOffset || m.CommitLogOffset != h.phys {
		t.Errorf("check body: %s/%d@%d phys %d %q", m.Topic, m.QueueID, m.QueueOffset, m.CommitLogOffset, m.Body)
	}
	wantProps(t, &m, protocol.PropProducerGroup, "txpg", "userProp", "v", protocol.PropUniqKey, h.txID,
		protocol.PropTransactionPrepared, "true", protocol.PropTransactionCheckTimes, "1")
	if n := len(other.requests(protocol.ReqCheckTransactionState)); n != 0 {
		t.Errorf("a producer of another group got %d check-backs", n)
	}
	// The producer answers the check the way the Go client does.
	ans := h
	ans.queueOffset, ans.phys = ch.TranStateTableOffset, ch.CommitLogOffset
	if resp := p.invoke(t, endReq("txpg", ans, protocol.SysFlagTransactionCommit, true)); resp.Code != protocol.ResSuccess {
		t.Fatalf("commit from check: %d %q", resp.Code, resp.Remark)
	}
	if got := bodies(subMessages(t, b, "TxTopic", 3)); len(got) != 1 || got[0] != "check me" {
		t.Fatalf("TxTopic/3 holds %q", got)
	}
	// Ended: no more check-backs, and the scan progress moves past it.
	subEventually(t, 5*time.Second, func() error {
		if b.tx.scanFrom.Load() != h.queueOffset+1 {
			return fmt.Errorf("scan progress %d", b.tx.scanFrom.Load())
		}
		return nil
	})
	n := len(p.requests(protocol.ReqCheckTransactionState))
	clk.advance(time.Minute)
	subNever(t, 200*time.Millisecond, func() bool { return len(p.requests(protocol.ReqCheckTransactionState)) > n }, "check-back after the commit")
	if st := b.TransactionStats(); st.CheckBacks < 1 || st.Committed != 1 {
		t.Errorf("stats %+v", st)
	}
}

// TestBrokerTransactionCheckSkipsEnded: a check round passes over half
// messages whose outcome is cached (committed, rolled back) without
// checking them, stops its progress at a pending one and checks only that
// one; once it ends the progress moves past the rest.
func TestBrokerTransactionCheckSkipsEnded(t *testing.T) {
	subLeakCheck(t)
	clk := &subClock{}
	b := txBroker(t, t.TempDir(), clk)
	p := txProducer(t, b, "producer-1", "txpg")
	var hs []txHalf
	for i := range 7 {
		hs = append(hs, txSend(t, p, "txpg", "TxTopic", 0, "m"+strconv.Itoa(i)))
	}
	const pending = 3
	for i, h := range hs {
		switch {
		case i == pending:
		case i%2 == 0:
			mustEnd(t, p, "txpg", h, protocol.SysFlagTransactionCommit)
		default:
			mustEnd(t, p, "txpg", h, protocol.SysFlagTransactionRollback)
		}
	}
	clk.advance(7 * time.Second)
	subEventually(t, 5*time.Second, func() error {
		if n := len(p.requests(protocol.ReqCheckTransactionState)); n == 0 {
			return errors.New("no check-back")
		}
		return nil
	})
	for _, req := range p.requests(protocol.ReqCheckTransactionState) {
		if ch, _ := checkOf(t, req); ch.TranStateTableOffset != hs[pending].queueOffset {
			t.Errorf("check-back of half message %d, want only %d", ch.TranStateTableOffset, hs[pending].queueOffset)
		}
	}
	// The round stores its progress after sending its check-backs: wait
	// for it, and it must stop at the pending one.
	subEventually(t, 5*time.Second, func() error {
		if got := b.tx.scanFrom.Load(); got != hs[pending].queueOffset {
			return fmt.Errorf("scan progress %d with half message %d pending", got, hs[pending].queueOffset)
		}
		return nil
	})
	mustEnd(t, p, "txpg", hs[pending], protocol.SysFlagTransactionCommit)
	subEventually(t, 5*time.Second, func() error {
		if got, want := b.tx.scanFrom.Load(), hs[len(hs)-1].queueOffset+1; got != want {
			return fmt.Errorf("scan progress %d, want %d", got, want)
		}
		return nil
	})
	if got := bodies(subMessages(t, b, "TxTopic", 0)); strings.Join(got, ",") != "m0,m2,m4,m6,m3" {
		t.Errorf("TxTopic/0 holds %q", got)
	}
}

func TestBrokerTransactionCheckWaitsForProducer(t *testing.T) {
	subLeakCheck(t)
	clk := &subClock{}
	dir := t.TempDir()
	b := txBroker(t, dir, clk, WithTransactionTimeout(0))
	c := subDial(t, b, "sender")
	h := txSend(t, c, "txpg", "TxTopic", 0, "orphan")
	// No producer of txpg online: nothing is sent and nothing counted.
	subNever(t, 300*time.Millisecond, func() bool { return b.TransactionStats().CheckBacks > 0 }, "check-back without a producer")
	if n, _ := b.tx.getMetaInt(txChecksKey(h.queueOffset)); n != 0 {
		t.Fatalf("check count %d without a producer", n)
	}
	// Once a producer heartbeats, the next round checks it, counting from 1.
	p := txProducer(t, b, "producer-1", "txpg")
	subEventually(t, 5*time.Second, func() error {
		if len(p.requests(protocol.ReqCheckTransactionState)) < 2 {
			return errors.New("fewer than 2 check-backs")
		}
		return nil
	})
	_, m1 := checkOf(t, p.requests(protocol.ReqCheckTransactionState)[0])
	_, m2 := checkOf(t, p.requests(protocol.ReqCheckTransactionState)[1])
	wantProps(t, &m1, protocol.PropTransactionCheckTimes, "1")
	wantProps(t, &m2, protocol.PropTransactionCheckTimes, "2")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// The count survives a restart.
	b = txBroker(t, dir, clk, WithTransactionTimeout(0))
	p = txProducer(t, b, "producer-1", "txpg")
	subEventually(t, 5*time.Second, func() error {
		if len(p.requests(protocol.ReqCheckTransactionState)) < 1 {
			return errors.New("no check-back after restart")
		}
		return nil
	})
	_, m3 := checkOf(t, p.requests(protocol.ReqCheckTransactionState)[0])
	if v, _ := m3.Property(protocol.PropTransactionCheckTimes); v == "1" || v == "2" || v == "" {
		t.Errorf("first check-back after restart has TRANSACTION_CHECK_TIMES %q, want > 2", v)
	}
}

func TestBrokerTransactionMaxChecksDiscard(t *testing.T) {
	subLeakCheck(t)
	clk := &subClock{}
	b := txBroker(t, t.TempDir(), clk, WithTransactionTimeout(0), WithTransactionCheckMax(3))
	p := txProducer(t, b, "producer-1", "txpg")
	h := txSend(t, p, "txpg", "TxTopic", 1, "never answered")
	subEventually(t, 5*time.Second, func() error {
		if st := b.TransactionStats(); st.Discarded != 1 {
			return fmt.Errorf("stats %+v", st)
		}
		return nil
	})
	if n := len(p.requests(protocol.ReqCheckTransactionState)); n != 3 {
		t.Errorf("%d check-backs before the discard, want 3", n)
	}
	got := subMessages(t, b, topicTransCheckMax, 0)
	if len(got) != 1 || string(got[0].Body) != "never answered" {
		t.Fatalf("%s holds %q", topicTransCheckMax, bodies(got))
	}
	wantProps(t, &got[0], protocol.PropRealTopic, "TxTopic", protocol.PropProducerGroup, "txpg", protocol.PropTransactionCheckTimes, "3")
	if _, ok := b.topicConfig(topicTransCheckMax); !ok {
		t.Error("TRANS_CHECK_MAX_TIME_TOPIC was not created")
	}
	// Discarded is final: a late commit is refused, a rollback is a no-op.
	if resp := endTx(t, p, "txpg", h, protocol.SysFlagTransactionCommit); resp.Code != protocol.ResSystemError {
		t.Errorf("commit after discard: %d %q", resp.Code, resp.Remark)
	}
	mustEnd(t, p, "txpg", h, protocol.SysFlagTransactionRollback)
	if got := subMessages(t, b, "TxTopic", 1); len(got) != 0 {
		t.Fatalf("discarded message visible: %q", bodies(got))
	}
	subNever(t, 200*time.Millisecond, func() bool { return len(p.requests(protocol.ReqCheckTransactionState)) > 3 }, "check-back after the discard")
}

func TestBrokerTransactionImmunity(t *testing.T) {
	subLeakCheck(t)
	clk := &subClock{}
	b := txBroker(t, t.TempDir(), clk)
	p := txProducer(t, b, "producer-1", "txpg")
	immune := txSend(t, p, "txpg", "TxTopic", 0, "immune", protocol.PropCheckImmunityTime, "60")
	plain := txSend(t, p, "txpg", "TxTopic", 0, "plain")
	checked := func() map[int64]int {
		out := map[int64]int{}
		for _, r := range p.requests(protocol.ReqCheckTransactionState) {
			h, _ := checkOf(t, r)
			out[h.TranStateTableOffset]++
		}
		return out
	}
	clk.advance(10 * time.Second)
	// The later message without immunity is checked; the immune one is not.
	subEventually(t, 5*time.Second, func() error {
		if checked()[plain.queueOffset] == 0 {
			return errors.New("plain half not checked")
		}
		return nil
	})
	if n := checked()[immune.queueOffset]; n != 0 {
		t.Fatalf("immune half checked %d times after 10 s", n)
	}
	clk.advance(55 * time.Second)
	subEventually(t, 5*time.Second, func() error {
		if checked()[immune.queueOffset] == 0 {
			return errors.New("immune half not checked after 65 s")
		}
		return nil
	})
}

func TestBrokerTransactionDelayedCommit(t *testing.T) {
	subLeakCheck(t)
	clk := &subClock{}
	b := txBroker(t, t.TempDir(), clk)
	c := subDial(t, b, "producer-1")
	h := txSend(t, c, "txpg", "TxTopic", 0, "delayed", protocol.PropDelayLevel, "2")
	// A half message is not delayed when it arrives.
	if n := len(subMessages(t, b, topicSchedule, 1)); n != 0 {
		t.Fatalf("half message went to the schedule topic (%d)", n)
	}
	mustEnd(t, c, "txpg", h, protocol.SysFlagTransactionCommit)
	s := subMessages(t, b, topicSchedule, 1)
	if len(s) != 1 {
		t.Fatalf("committed delayed message: schedule queue 1 holds %d", len(s))
	}
	if protocol.TransactionType(s[0].SysFlag) != protocol.SysFlagTransactionCommit || s[0].PreparedTransactionOffset != h.phys {
		t.Errorf("scheduled sysFlag %#x prepared %d", s[0].SysFlag, s[0].PreparedTransactionOffset)
	}
	mustEnd(t, c, "txpg", h, protocol.SysFlagTransactionCommit)
	if n := len(subMessages(t, b, topicSchedule, 1)); n != 1 {
		t.Fatalf("repeated commit scheduled again (%d)", n)
	}
	// The outcome is found through the store as well (after a restart, or
	// once the checker's progress passed it): the final message went to
	// the schedule topic, so an op record, not the real topic's commit
	// key, must record it.
	b.tx.mu.Lock()
	if i := h.queueOffset - b.tx.mu.endedBase; i >= 0 && i < int64(len(b.tx.mu.ended)) {
		b.tx.mu.ended[i] = txPending
	}
	b.tx.mu.pendingFrom = math.MaxInt64 // outcome unknown in memory
	b.tx.mu.Unlock()
	mustEnd(t, c, "txpg", h, protocol.SysFlagTransactionCommit)
	if n := len(subMessages(t, b, topicSchedule, 1)); n != 1 {
		t.Fatalf("commit repeated after the outcome left memory scheduled again (%d)", n)
	}
	clk.advance(6 * time.Second)
	subEventually(t, 5*time.Second, func() error {
		if got := subMessages(t, b, "TxTopic", 0); len(got) != 1 {
			return fmt.Errorf("TxTopic/0 holds %d", len(got))
		}
		return nil
	})
}

// The send response names the queue the client chose even when the
// message was moved to a schedule queue (Java reports the original).
func TestBrokerSendReportsOriginalQueue(t *testing.T) {
	subLeakCheck(t)
	clk := &subClock{}
	b := subBroker(t, t.TempDir(), clk)
	c := subDial(t, b, "p")
	for _, tc := range []struct {
		props map[string]string
		queue int32
	}{
		{map[string]string{"DELAY": "5"}, 2},
		{map[string]string{"TIMER_DELAY_SEC": "30"}, 3},
		{nil, 1},
	} {
		resp := c.send(t, protocol.ReqSendMessage, "Q", tc.queue, "x", tc.props, 0, 0)
		var rh protocol.SendMessageResponseHeader
		if err := rh.Decode(resp); err != nil || resp.Code != protocol.ResSuccess {
			t.Fatalf("send %v: %d %v", tc.props, resp.Code, err)
		}
		if rh.QueueID != tc.queue {
			t.Errorf("send %v to queue %d: response queueId %d", tc.props, tc.queue, rh.QueueID)
		}
	}
	if n := len(subMessages(t, b, topicSchedule, 4)); n != 1 {
		t.Errorf("schedule queue 4 holds %d", n)
	}
}

func TestBrokerSubsystemOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  Option
	}{
		{"no delay levels", WithDelayLevels(nil)},
		{"19 delay levels", WithDelayLevels(make([]time.Duration, 19))},
		{"zero delay level", WithDelayLevels([]time.Duration{time.Second, 0})},
		{"zero client expiry", WithClientExpiry(0, time.Second)},
		{"zero client scan", WithClientExpiry(time.Second, 0)},
		{"zero lock expiry", WithLockExpiry(0)},
		{"zero timer max delay", WithTimerMaxDelay(0)},
		{"tiny check interval", WithTransactionCheckInterval(time.Millisecond)},
		{"negative tx timeout", WithTransactionTimeout(-time.Second)},
		{"zero check max", WithTransactionCheckMax(0)},
	} {
		if _, err := New(WithDataDir(t.TempDir()), tc.opt); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: New returned %v", tc.name, err)
		}
	}

	subLeakCheck(t)
	// Short delay levels and timer max delay take effect (no clock jump).
	b := subBroker(t, t.TempDir(), &subClock{}, WithDelayLevels([]time.Duration{50 * time.Millisecond}),
		WithTimerMaxDelay(time.Minute), WithLockExpiry(time.Second), WithClientExpiry(time.Second, 100*time.Millisecond))
	c := subDial(t, b, "p")
	c.send(t, protocol.ReqSendMessage, "Short", 0, "soon", map[string]string{"DELAY": "7"}, 0, 0)
	subEventually(t, 5*time.Second, func() error {
		if n := len(subMessages(t, b, "Short", 0)); n != 1 {
			return fmt.Errorf("Short/0 holds %d", n)
		}
		return nil
	})
	if resp := c.send(t, protocol.ReqSendMessage, "Short", 0, "late", map[string]string{"TIMER_DELAY_SEC": "120"}, 0, 0); resp.Code != protocol.ResMessageIllegal {
		t.Errorf("timer beyond the max delay: %d %q", resp.Code, resp.Remark)
	}
	// A silent client is expired after 1 s of the broker's clock.
	if resp := c.heartbeat(t, "", "pg-short"); resp.Code != protocol.ResSuccess {
		t.Fatal(resp.Remark)
	}
	subEventually(t, 5*time.Second, func() error {
		select {
		case <-c.Done():
			return nil
		default:
			return errors.New("silent client not expired")
		}
	})
}

// BenchmarkBrokerTransaction measures a half-message send (with a KEYS
// value, as the ETL job's output has) plus its commit (two round trips,
// two group-committed store writes) over real TCP, from many goroutines.
// Allocations include the client side; cpu-us/tx is the process CPU time
// per transaction (client and broker; steadier than tx/s on a shared
// machine).
func BenchmarkBrokerTransaction(b *testing.B) {
	br := startBroker(b)
	const nConns = 4
	conns := make([]*subClient, nConns)
	for i := range conns {
		conns[i] = &subClient{Conn: dial(b, br.Addr())}
	}
	txSend(b, conns[0], "txpg", "BenchTx", 0, "warm-up")
	body := strings.Repeat("x", 128)
	var next, seq atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(16)
	cpu0 := cputime.Process()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c := conns[next.Add(1)%nConns]
		for pb.Next() {
			h := txSend(b, c, "txpg", "BenchTx", 0, body, protocol.PropKeys, "order-"+strconv.FormatInt(seq.Add(1), 10))
			mustEnd(b, c, "txpg", h, protocol.SysFlagTransactionCommit)
		}
	})
	b.ReportMetric(float64(cputime.Process()-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-us/tx")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tx/s")
}

// TestBrokerTransactionHalfCacheBound: WithTransactionHalfCache bounds the
// kept records: with room for one record the first half message is kept
// and the second is not (it ends through the store); 0 keeps none; a
// negative bound is refused.
func TestBrokerTransactionHalfCacheBound(t *testing.T) {
	subLeakCheck(t)
	clk := &subClock{}
	probe := txBroker(t, t.TempDir(), clk)
	cp := subDial(t, probe, "producer-0")
	ph := txSend(t, cp, "txpg", "TxTopic", 1, "body-1", protocol.PropKeys, "k1")
	rec, ok := probe.tx.cachedHalf(ph.queueOffset, ph.phys)
	if !ok {
		t.Fatal("a half message is not kept with the default bound")
	}
	size := len(rec) // the records below have the same size
	b := txBroker(t, t.TempDir(), clk, WithTransactionHalfCache(size+size/2))
	c := subDial(t, b, "producer-1")
	first := txSend(t, c, "txpg", "TxTopic", 1, "body-1", protocol.PropKeys, "k1")
	second := txSend(t, c, "txpg", "TxTopic", 1, "body-2", protocol.PropKeys, "k1")
	if _, ok := b.tx.cachedHalf(first.queueOffset, first.phys); !ok {
		t.Error("the first half message is not kept")
	}
	if _, ok := b.tx.cachedHalf(second.queueOffset, second.phys); ok {
		t.Error("a half message past the bound is kept")
	}
	mustEnd(t, c, "txpg", first, protocol.SysFlagTransactionCommit)
	mustEnd(t, c, "txpg", second, protocol.SysFlagTransactionCommit)
	if got := subMessages(t, b, "TxTopic", 1); len(got) != 2 {
		t.Errorf("%d final messages, want 2", len(got))
	}
	none := txBroker(t, t.TempDir(), clk, WithTransactionHalfCache(0))
	c0 := subDial(t, none, "producer-2")
	h := txSend(t, c0, "txpg", "TxTopic", 1, "none", protocol.PropKeys, "k1")
	if _, ok := none.tx.cachedHalf(h.queueOffset, h.phys); ok {
		t.Error("a half message is kept with a bound of 0")
	}
	mustEnd(t, c0, "txpg", h, protocol.SysFlagTransactionCommit)
	if _, err := New(WithDataDir(t.TempDir()), WithTransactionHalfCache(-1)); err == nil {
		t.Error("a negative half cache bound was accepted")
	}
}

// TestBrokerTransactionKeptHalves: END_TRANSACTION reads half messages this
// process stored from memory and knows an outcome missing from its cache
// is pending; the final messages and answers are the same as through the
// store (a half message whose record was not kept, or one stored before a
// restart).
func TestBrokerTransactionKeptHalves(t *testing.T) {
	subLeakCheck(t)
	clk := &subClock{}
	dir := t.TempDir()
	b := txBroker(t, dir, clk)
	c := subDial(t, b, "producer-1")
	kept := txSend(t, c, "txpg", "TxTopic", 1, "kept", protocol.PropKeys, "k1", protocol.PropDelayLevel, "0")
	read := txSend(t, c, "txpg", "TxTopic", 1, "read", protocol.PropKeys, "k1", protocol.PropDelayLevel, "0")
	beforeRestart := txSend(t, c, "txpg", "TxTopic", 1, "restart", protocol.PropKeys, "k1", protocol.PropDelayLevel, "0")
	if _, ok := b.tx.cachedHalf(kept.queueOffset, kept.phys); !ok {
		t.Fatal("a half message this process stored is not kept")
	}
	if rec, _ := b.tx.cachedHalf(kept.queueOffset, kept.phys); len(rec) == 0 {
		t.Fatal("empty kept record")
	}
	subEventually(t, 5*time.Second, func() error {
		b.tx.mu.Lock()
		defer b.tx.mu.Unlock()
		if b.tx.mu.pendingFrom != 0 {
			return fmt.Errorf("pendingFrom %d, want 0 (empty half queue at start)", b.tx.mu.pendingFrom)
		}
		return nil
	})
	b.tx.forgetHalf(read.queueOffset, read.phys) // as if the cache had been full
	mustEnd(t, c, "txpg", kept, protocol.SysFlagTransactionCommit)
	if n := b.tx.inlineEnds.Load(); n != 1 {
		t.Errorf("the end of a kept half message was not served inline (%d inline ends)", n)
	}
	mustEnd(t, c, "txpg", read, protocol.SysFlagTransactionCommit)
	if n := b.tx.inlineEnds.Load(); n != 1 {
		t.Errorf("the end of a half message read from the store was served inline (%d inline ends)", n)
	}
	if _, ok := b.tx.cachedHalf(kept.queueOffset, kept.phys); ok {
		t.Error("the record of a committed half message is still kept")
	}
	// Repeats and contradictions are answered from the outcome cache.
	mustEnd(t, c, "txpg", kept, protocol.SysFlagTransactionCommit)
	if resp := endTx(t, c, "txpg", kept, protocol.SysFlagTransactionRollback); resp.Code != protocol.ResSystemError {
		t.Errorf("rollback after commit: %d %q", resp.Code, resp.Remark)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b = txBroker(t, dir, clk)
	c = subDial(t, b, "producer-2")
	if _, ok := b.tx.cachedHalf(beforeRestart.queueOffset, beforeRestart.phys); ok {
		t.Fatal("a half message of an earlier process is kept")
	}
	// Before a restart: not kept, outcome looked up in the store.
	mustEnd(t, c, "txpg", kept, protocol.SysFlagTransactionCommit)
	mustEnd(t, c, "txpg", beforeRestart, protocol.SysFlagTransactionCommit)
	if resp := endTx(t, c, "txpg", read, protocol.SysFlagTransactionRollback); resp.Code != protocol.ResSystemError {
		t.Errorf("rollback after commit, after a restart: %d %q", resp.Code, resp.Remark)
	}
	got := subMessages(t, b, "TxTopic", 1)
	if len(got) != 3 {
		t.Fatalf("TxTopic/1 holds %q, want kept, read, restart", bodies(got))
	}
	halves := subMessages(t, b, topicTransHalf, 0)
	for i := range got {
		m, h := &got[i], &halves[i]
		if m.PreparedTransactionOffset != h.CommitLogOffset || m.Flag != h.Flag || m.BornTimestamp != h.BornTimestamp ||
			m.BornHost != h.BornHost || m.ReconsumeTimes != h.ReconsumeTimes || string(m.Body) != string(h.Body) ||
			protocol.TransactionType(m.SysFlag) != protocol.SysFlagTransactionCommit {
			t.Errorf("final %d %+v does not match its half message %+v", i, m, h)
		}
		wantProps(t, m, protocol.PropTransactionPrepared, "", protocol.PropRealTopic, "", protocol.PropRealQueueID, "",
			protocol.PropProducerGroup, "txpg", protocol.PropKeys, "k1", protocol.PropTags, "tx", protocol.PropDelayLevel, "0")
		if i > 0 && (got[i].Properties != strings.Replace(got[0].Properties, uniqOf(&got[0]), uniqOf(&got[i]), -1)) {
			t.Errorf("final %d properties %q differ from the kept path's %q beyond the ids", i, got[i].Properties, got[0].Properties)
		}
	}
	if st := b.TransactionStats(); st.Committed != 1 {
		t.Errorf("stats after restart %+v, want one commit", st)
	}
}

func uniqOf(m *protocol.MessageExt) string { return m.UniqKey() }

// TestKeptHalvesWindow: kept half records are found by half queue offset
// and physical offset only, ending them moves the window's front, and a
// half message pending for more than halfWindowMax offsets is dropped
// (read from the store when it ends) instead of pinning the window.
func TestKeptHalvesWindow(t *testing.T) {
	tx := &transactions{cfg: txConfig{halfCache: DefaultTransactionHalfCache}}
	rec := func(off int64) []byte {
		r := make([]byte, 64)
		binary.BigEndian.PutUint64(r[protocol.RecordQueueOffsetPos:], uint64(off))
		return r
	}
	phys := func(off int64) int64 { return 1000 + 64*off }
	for off := int64(5); off < 10; off++ {
		tx.halfStored(rec(off), phys(off))
	}
	if _, ok := tx.cachedHalf(7, phys(7)); !ok {
		t.Fatal("kept record 7 not found")
	}
	if _, ok := tx.cachedHalf(7, phys(8)); ok {
		t.Fatal("kept record found under another physical offset")
	}
	if _, ok := tx.cachedHalf(4, phys(4)); ok {
		t.Fatal("record never kept found")
	}
	tx.forgetHalf(6, phys(6))
	tx.forgetHalf(5, phys(5))
	if tx.halves.base != 7 || len(tx.halves.slots) != 3 || tx.halves.bytes != 3*64 {
		t.Fatalf("window after ending its front: base %d, %d slots, %d bytes", tx.halves.base, len(tx.halves.slots), tx.halves.bytes)
	}
	tx.halfStored(rec(5), phys(5)) // behind the window: not kept
	if _, ok := tx.cachedHalf(5, phys(5)); ok {
		t.Fatal("record behind the window kept")
	}
	// 7 stays pending while far later half messages arrive.
	tx.forgetHalf(8, phys(8))
	tx.forgetHalf(9, phys(9))
	far := int64(7 + halfWindowMax)
	tx.halfStored(rec(far), phys(far))
	if _, ok := tx.cachedHalf(7, phys(7)); ok {
		t.Fatal("a half message pending past the window is still kept")
	}
	if _, ok := tx.cachedHalf(far, phys(far)); !ok {
		t.Fatal("the record that moved the window is not kept")
	}
	if tx.halves.bytes != 64 || int64(len(tx.halves.slots)) > halfWindowMax {
		t.Fatalf("after the move: %d bytes, %d slots", tx.halves.bytes, len(tx.halves.slots))
	}
	tx.forgetHalf(far, phys(far))
	if len(tx.halves.slots) != 0 || tx.halves.bytes != 0 {
		t.Fatalf("empty window: %d slots, %d bytes", len(tx.halves.slots), tx.halves.bytes)
	}
}

// TestEndedWindow: cached outcomes are kept by half queue offset from
// scanFrom on, pruned below the checker's progress, and a window that
// would span more than maxEndedCache offsets turns the known-pending fast
// path off instead of growing.
func TestEndedWindow(t *testing.T) {
	tx := &transactions{}
	tx.mu.pendingFrom = 0
	tx.scanFrom.Store(10)
	tx.markEnded(5, txCommitted) // below scanFrom: not cached
	tx.markEnded(12, txCommitted)
	tx.markEnded(11, txRolledBack)
	tx.markEnded(13, txDiscarded)
	for off, want := range map[int64]txState{5: txPending, 10: txPending, 11: txRolledBack, 12: txCommitted, 13: txDiscarded, 14: txPending} {
		if st, known := tx.knownState(off); off >= 10 && (!known || st != want) {
			t.Errorf("offset %d: %v known %v, want %v", off, st, known, want)
		}
	}
	if st, known := tx.knownState(5); known {
		t.Errorf("offset 5 below scanFrom known as %v", st)
	}
	if n := tx.endedRun(10, 20); n != 0 {
		t.Errorf("ended run from 10 (pending): %d", n)
	}
	if n := tx.endedRun(11, 20); n != 3 {
		t.Errorf("ended run from 11: %d, want 3", n)
	}
	tx.scanFrom.Store(12) // the checker's progress, then its prune
	tx.mu.Lock()
	tx.pruneEndedLocked(12)
	base, n := tx.mu.endedBase, len(tx.mu.ended)
	tx.mu.Unlock()
	if base != 12 || n != 2 {
		t.Fatalf("after the prune to 12: base %d, %d offsets", base, n)
	}
	if st, known := tx.knownState(13); !known || st != txDiscarded {
		t.Errorf("offset 13 after the prune: %v known %v", st, known)
	}
	tx.markEnded(12+maxEndedCache, txCommitted) // too far from scanFrom
	if st, known := tx.knownState(12 + maxEndedCache); known {
		t.Errorf("an outcome past the window is known (%v)", st)
	}
	if st, known := tx.knownState(14); known {
		t.Errorf("pending still assumed after the window overflowed (%v)", st)
	}
	if st, known := tx.knownState(13); !known || st != txDiscarded {
		t.Errorf("offset 13 after the overflow: %v known %v", st, known)
	}
}
