// END_TRANSACTION: per half message locks, the ended-state bookkeeping and
// its op records, finding a half message, and ending it (the final message
// stored with the op record, or a rollback's op record alone).

package broker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"unsafe"

	"github.com/runnel-dev/runnel/transport/broker/internal/store"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// lock waits until no other goroutine ends the half message at physical
// offset phys and claims it; the returned func releases it.
func (t *transactions) lock(ctx context.Context, phys int64) (func(), error) {
	for {
		t.mu.Lock()
		ch, held := t.mu.busy[phys]
		if !held {
			t.mu.busy[phys] = nil // no waiter yet
			t.mu.Unlock()
			return func() { t.unlock(phys) }, nil
		}
		if ch == nil {
			ch = make(chan struct{})
			t.mu.busy[phys] = ch
		}
		t.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// tryLock claims the half message at phys if no one else is ending it.
func (t *transactions) tryLock(phys int64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, held := t.mu.busy[phys]; held {
		return false
	}
	t.mu.busy[phys] = nil
	return true
}

// unlock releases a claim of lock or tryLock and wakes its waiters.
func (t *transactions) unlock(phys int64) {
	t.mu.Lock()
	ch := t.mu.busy[phys]
	delete(t.mu.busy, phys)
	t.mu.Unlock()
	if ch != nil {
		close(ch)
	}
}

// markEnded caches the outcome of the half message at queue offset off.
func (t *transactions) markEnded(off int64, st txState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	scanFrom := t.scanFrom.Load()
	if off < scanFrom {
		return
	}
	if len(t.mu.ended) == 0 || off-t.mu.endedBase >= maxEndedCache {
		t.pruneEndedLocked(scanFrom) // nothing below scanFrom is needed
	}
	i := off - t.mu.endedBase
	if i >= maxEndedCache {
		t.mu.pendingFrom = math.MaxInt64 // the cache no longer has every outcome
		return
	}
	for int64(len(t.mu.ended)) <= i {
		t.mu.ended = append(t.mu.ended, txPending)
	}
	t.mu.ended[i] = st
}

// pruneEndedLocked forgets the cached outcomes below offset off (at most
// scanFrom). Requires t.mu.
func (t *transactions) pruneEndedLocked(off int64) {
	n := off - t.mu.endedBase
	if n <= 0 {
		return
	}
	if n >= int64(len(t.mu.ended)) {
		t.mu.ended = t.mu.ended[:0]
	} else {
		t.mu.ended = t.mu.ended[n:]
	}
	t.mu.endedBase = off
}

// endedAt returns the cached outcome of the half message at queue offset
// off (txPending: none). Requires t.mu.
func (t *transactions) endedAt(off int64) txState {
	i := off - t.mu.endedBase
	if i < 0 || i >= int64(len(t.mu.ended)) {
		return txPending
	}
	return t.mu.ended[i]
}

func opKey(off int64) string { return strconv.FormatInt(off, 10) }

// knownState returns the outcome of the half message at queue offset off
// if it is known without reading the store.
func (t *transactions) knownState(off int64) (txState, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if st := t.endedAt(off); st != txPending {
		return st, true
	}
	// scanFrom is read under t.mu: prune moves it before it deletes
	// outcomes below it (under t.mu), so an outcome missing here at or
	// above the scanFrom read is not pruned but unknown, i.e. pending.
	if off >= t.mu.pendingFrom && off >= t.scanFrom.Load() {
		return txPending, true
	}
	return txPending, false
}

// commitKey is the index key of the final message of a commit that wrote
// no op record (see the file comment): the space keeps it apart from every
// KEYS value.
func commitKey(off int64) string { return "RMQ_TX_COMMIT " + strconv.FormatInt(off, 10) }

// state returns the outcome of the half message half.
func (t *transactions) state(half *protocol.MessageExt) (txState, error) {
	off := half.QueueOffset
	if st, ok := t.knownState(off); ok {
		return st, nil
	}
	recs, err := t.b.store.QueryByKey(topicTransOpHalf, opKey(off), store.MaxQueryNum, 0, math.MaxInt64)
	if err != nil {
		return txPending, fmt.Errorf("broker: transaction op record of %d: %w", off, err)
	}
	want := opKey(off) + ","
	for _, rec := range recs {
		m, _, err := protocol.DecodeRecord(rec)
		if err != nil || string(m.Body) != want {
			continue
		}
		v, _ := m.Property(propTxState)
		if st := parseTxState(v); st != txPending {
			return st, nil
		}
	}
	topic, _, err := realTarget(half)
	if err != nil {
		return txPending, nil // never committed: a commit needs the real topic
	}
	// commitOf reports whether rec is the committed message of this half
	// message: its physical offset in preparedTransactionOffset, commit
	// bits.
	commitOf := func(rec []byte) bool {
		m, _, err := protocol.DecodeRecord(rec)
		return err == nil && m.PreparedTransactionOffset == half.CommitLogOffset &&
			protocol.TransactionType(m.SysFlag) == protocol.SysFlagTransactionCommit
	}
	if uniq := half.UniqKey(); uniq != "" && len(uniq) <= store.MaxNameLen {
		// Every record under the key (no cap: a UNIQ_KEY reused by a
		// client must not hide the commit), from the half message's
		// store time on.
		committed := false
		err := t.b.store.ScanKey(topic, uniq, half.StoreTimestamp, func(rec []byte) bool {
			committed = commitOf(rec)
			return !committed
		})
		if err != nil {
			return txPending, fmt.Errorf("broker: committed message of half message %d in %s: %w", off, topic, err)
		}
		if committed {
			return txCommitted, nil
		}
	}
	recs, err = t.b.store.QueryByKey(topic, commitKey(off), store.MaxQueryNum, 0, math.MaxInt64)
	if err != nil {
		return txPending, fmt.Errorf("broker: committed message of half message %d in %s: %w", off, topic, err)
	}
	for _, rec := range recs {
		if commitOf(rec) {
			return txCommitted, nil
		}
	}
	return txPending, nil
}

// opRecord builds the op record ending the half message at queue offset
// off with outcome st.
func (t *transactions) opRecord(off int64, st txState) *InboundMessage {
	p := make([]byte, 0, 64)
	p = protocol.AppendProperty(p, protocol.PropTags, opTag)
	p = protocol.AppendProperty(p, protocol.PropKeys, opKey(off))
	p = protocol.AppendProperty(p, propTxState, st.String())
	return &InboundMessage{
		Topic:             topicTransOpHalf,
		Body:              []byte(opKey(off) + ","),
		Properties:        string(p),
		BornTimestamp:     t.b.now().UnixMilli(),
		BornHost:          t.b.host,
		MaxReconsumeTimes: -1,
	}
}

// findHalf returns the half message stored at physical offset phys (off:
// its half queue offset as the request says, which finds its kept record).
func (t *transactions) findHalf(off, phys int64) (protocol.MessageExt, error) {
	var m protocol.MessageExt
	var err error
	if rec, ok := t.cachedHalf(off, phys); ok {
		m, _, err = protocol.DecodeRecord(rec)
		if err == nil && m.CommitLogOffset != phys {
			err = fmt.Errorf("broker: kept half message at %d says %d", phys, m.CommitLogOffset)
		}
		if err != nil {
			t.forgetHalf(off, phys)
			t.log.Error("broker: kept half message unusable; reading the store", "phys", phys, "err", err)
			m, _, err = t.b.lookupByPhysicalOffset(phys)
		}
	} else {
		m, _, err = t.b.lookupByPhysicalOffset(phys)
	}
	if err != nil {
		return protocol.MessageExt{}, err
	}
	if m.Topic != topicTransHalf || m.QueueID != 0 {
		return protocol.MessageExt{}, fmt.Errorf("broker: physical offset %d is in %s/%d: %w", phys, m.Topic, m.QueueID, store.ErrNotFound)
	}
	return m, nil
}

func sysError(remark string) *protocol.Error {
	return &protocol.Error{Code: protocol.ResSystemError, Remark: remark}
}

// slaveRefusesEnd is the remark of a slave's refusal of END_TRANSACTION
// (Java answers SLAVE_NOT_AVAILABLE: "Message store is slave mode, so end
// transaction is forbidden").
const slaveRefusesEnd = "message store is slave mode, so end transaction is forbidden: end it on the master"

// processEnd serves END_TRANSACTION (37). commitOrRollback 0 (unknown) or
// any value other than 8 and 12 gets no response, as from Java.
func (t *transactions) processEnd(ctx context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var h protocol.EndTransactionRequestHeader
	if err := h.Decode(req); err != nil {
		return respond(req, protocol.ResInvalidParameter, err.Error()), nil
	}
	var want txState
	switch h.CommitOrRollback {
	case protocol.SysFlagTransactionCommit:
		want = txCommitted
	case protocol.SysFlagTransactionRollback:
		want = txRolledBack
	default:
		t.log.Debug("broker: transaction state unknown; left for check-back", "group", h.ProducerGroup,
			"msgId", h.MsgID, "fromCheck", h.FromTransactionCheck.Or(false))
		return nil, nil
	}
	if !t.b.running() {
		return respond(req, protocol.ResServiceNotAvailable, "broker is shutting down"), nil
	}
	if t.b.isSlave() {
		return respond(req, protocol.ResSlaveNotAvailable, slaveRefusesEnd), nil
	}
	if err := t.end(ctx, &h, want, rc); err != nil {
		return errorResponse(req, err), nil
	}
	return protocol.NewResponse(req, protocol.ResSuccess, ""), nil
}

// end commits or rolls back the half message h names.
func (t *transactions) end(ctx context.Context, h *protocol.EndTransactionRequestHeader, want txState, rc *remoting.RequestCtx) error {
	unlock, err := t.lock(ctx, h.CommitLogOffset)
	if err != nil {
		return &protocol.Error{Code: protocol.ResSystemBusy, Remark: "[REJECTREQUEST]system busy: " + err.Error()}
	}
	defer unlock()
	half, err := t.findHalf(h.TranStateTableOffset, h.CommitLogOffset)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return sysError(remarkHalfNotFound)
	case err != nil:
		return err
	}
	if err := checkHalf(&half, h); err != nil {
		return err
	}
	st, err := t.state(&half)
	if err != nil {
		return err
	}
	if done, err := t.alreadyEnded(&half, st, want); done {
		return err
	}
	var sc endScratch
	msgs, err := t.endRecords(ctx, &half, want, rc, false, &sc)
	if err != nil {
		return err
	}
	_, end, err := t.b.storeAll(ctx, msgs...)
	if err != nil {
		return err
	}
	t.ended(&half, want)
	if t.b.syncMasterWait(msgs[0].Properties) {
		// Java's end waits for the replica of what it stored, then
		// answers SUCCESS whatever the slave did.
		t.b.awaitReplicaBlocking(ctx, end)
	}
	return nil
}

// checkHalf checks that the half message found at h's physical offset is
// the one h names (Java's checkPrepareMessage).
func checkHalf(half *protocol.MessageExt, h *protocol.EndTransactionRequestHeader) error {
	if pg, ok := half.Property(protocol.PropProducerGroup); !ok || pg != h.ProducerGroup {
		return sysError(remarkWrongGroup)
	}
	if half.QueueOffset != h.TranStateTableOffset {
		return sysError(remarkWrongStateOff)
	}
	if half.CommitLogOffset != h.CommitLogOffset {
		return sysError(remarkWrongLogOff)
	}
	return nil
}

// alreadyEnded answers an end of a half message whose outcome is st: done
// when it is not pending (nil for a repeat of the same end, an error for a
// contradicting one).
func (t *transactions) alreadyEnded(half *protocol.MessageExt, st, want txState) (done bool, err error) {
	switch {
	case st == txPending:
		return false, nil
	case st == want, st == txDiscarded && want == txRolledBack:
		t.markEnded(half.QueueOffset, st)
		t.forgetHalf(half.QueueOffset, half.CommitLogOffset)
		return true, nil // repeated end: already done
	}
	return true, &protocol.Error{Code: protocol.ResSystemError,
		Remark: "the transaction already ended with " + st.String() + ", cannot " + want.String()}
}

// errEndMayBlock: the final message's store path may block (inline only).
var errEndMayBlock = errors.New("broker: final message may block")

// endRecords returns what ending half with want stores in one atomic Put:
// its op record, after the final message for a commit. With inline it
// fails with errEndMayBlock when the final message's rewrite may block,
// and a commit whose final message stays in the real topic returns the
// final message alone (pendingEnd.put indexes it under commitKey instead
// of storing an op record). The final message and the returned slice are
// built in sc (the inline path's is pooled with its pendingEnd): they are
// valid while sc is not reused.
func (t *transactions) endRecords(ctx context.Context, half *protocol.MessageExt, want txState, rc *remoting.RequestCtx, inline bool, sc *endScratch) ([]*InboundMessage, error) {
	if want == txRolledBack {
		sc.msgs[0] = t.opRecord(half.QueueOffset, want)
		return sc.msgs[:1], nil
	}
	final := &sc.final
	var err error
	if sc.props, err = finalMessage(final, sc.props[:0], half, half.CommitLogOffset); err != nil {
		return nil, sysError(err.Error())
	}
	if rc != nil {
		final.Code, final.ClientVersion, final.Conn = rc.Request().Code, rc.Request().Version, rc.Conn()
	}
	// The committed message is delayed like any other (DELAY, TIMER_*).
	realTopic := final.Topic
	if f := t.b.ext.beforeStore; f != nil {
		if inline && t.b.sendMayBlock(&protocol.SendMessageRequestHeader{Topic: final.Topic, Properties: final.Properties}) {
			return nil, errEndMayBlock
		}
		if err := f(ctx, final); err != nil {
			return nil, err
		}
	}
	sc.msgs[0] = final
	// The compact form only when the final message stays in the real
	// topic: the outcome lookup reads the commit key there, so a final
	// message moved (a delayed one, to the schedule or timer topic) gets
	// an op record.
	if inline && final.Topic == realTopic {
		return sc.msgs[:1], nil
	}
	sc.msgs[1] = t.opRecord(half.QueueOffset, want)
	return sc.msgs[:2], nil
}

// endScratch is where endRecords builds an end's records: the final
// message, its properties and the list of records.
type endScratch struct {
	final InboundMessage
	props []byte // final.Properties aliases it
	msgs  [2]*InboundMessage
}

// ended records that half ended with want (its records are stored).
func (t *transactions) ended(half *protocol.MessageExt, want txState) {
	if want == txCommitted {
		t.committed.Add(1)
	} else {
		t.rolledBack.Add(1)
	}
	t.markEnded(half.QueueOffset, want)
	t.forgetHalf(half.QueueOffset, half.CommitLogOffset)
}

// realTarget returns a half message's REAL_TOPIC and REAL_QID.
func realTarget(m *protocol.MessageExt) (string, int32, error) {
	topic, ok := m.Property(protocol.PropRealTopic)
	qs, ok2 := m.Property(protocol.PropRealQueueID)
	return parseRealTarget(topic, qs, ok && ok2)
}

// parseRealTarget checks a half message's REAL_TOPIC and REAL_QID (ok:
// both present).
func parseRealTarget(topic, qs string, ok bool) (string, int32, error) {
	if !ok {
		return "", 0, errors.New("half message without REAL_TOPIC/REAL_QID")
	}
	qid, err := strconv.ParseInt(qs, 10, 32)
	if err != nil || qid < 0 {
		return "", 0, fmt.Errorf("half message with REAL_QID %q", qs)
	}
	if err := validateTopic(topic); err != nil {
		return "", 0, fmt.Errorf("half message with REAL_TOPIC %q: %w", topic, err)
	}
	return topic, int32(qid), nil
}

// finalMessage builds the committed message of a half message: real topic
// and queue, commit transaction bits, preparedTransactionOffset = the half
// message's physical offset, TRAN_MSG and REAL_* removed.
//
// One pass over the half message's properties finds REAL_*, PGROUP and
// DELAY and copies the rest (the last of duplicates wins, as in
// PropertyValue). It fills m and appends the properties to props, which it
// returns: m.Properties aliases the appended bytes, which must not be
// written again while m is in use.
func finalMessage(m *InboundMessage, props []byte, half *protocol.MessageExt, phys int64) ([]byte, error) {
	var rTopic, rQID, group, delay string
	var hasTopic, hasQID bool
	start := len(props)
	props = slices.Grow(props, len(half.Properties))
	protocol.RangeProperties(half.Properties, func(n, v string) bool {
		switch n {
		case protocol.PropRealTopic:
			rTopic, hasTopic = v, true
			return true
		case protocol.PropRealQueueID:
			rQID, hasQID = v, true
			return true
		case protocol.PropTransactionPrepared, protocol.PropTransactionCheckTimes:
			return true
		case protocol.PropProducerGroup:
			group = v
		case protocol.PropDelayLevel:
			delay = v
		}
		props = protocol.AppendProperty(props, n, v)
		return true
	})
	topic, qid, err := parseRealTarget(rTopic, rQID, hasTopic && hasQID)
	if err != nil {
		return props, err
	}
	p := props[start:]
	*m = InboundMessage{
		Topic:                     topic,
		QueueID:                   qid,
		Flag:                      half.Flag,
		Body:                      half.Body,
		Properties:                unsafe.String(unsafe.SliceData(p), len(p)), // p is not written again while m is used
		SysFlag:                   protocol.SetTransactionType(half.SysFlag, protocol.SysFlagTransactionCommit),
		BornTimestamp:             half.BornTimestamp,
		BornHost:                  half.BornHost,
		ReconsumeTimes:            half.ReconsumeTimes,
		MaxReconsumeTimes:         -1,
		PreparedTransactionOffset: phys,
		ProducerGroup:             group,
	}
	if delay != "" {
		if v, err := strconv.ParseInt(delay, 10, 32); err == nil {
			m.DelayLevel = int32(v)
		}
	}
	return props, nil
}
