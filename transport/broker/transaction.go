package broker

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/runnel-dev/runnel/transport/broker/internal/store"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// Transactional messages (protocol §7.4).
//
// # Half messages
//
// A send with TRAN_MSG=true or the prepared sysFlag bits is stored in queue
// 0 of RMQ_SYS_TRANS_HALF_TOPIC with __transactionId__ (= UNIQ_KEY),
// REAL_TOPIC and REAL_QID added and its transaction bits reset, so no
// consumer of the real topic sees it. A half message is identified by its
// queue offset h in the half queue (and its physical offset c).
//
// # Op records
//
// A half message ends once: committed, rolled back, or discarded after
// too many check-backs. The end is recorded by an op record: a message in
// queue 0 of RMQ_SYS_TRANS_OP_HALF_TOPIC (tag "d", body "h,", as Java
// writes it) indexed under the key "h" and carrying the outcome in
// propTxState. A commit stores the final message (and a discard the copy in
// TRANS_CHECK_MAX_TIME_TOPIC) in the SAME atomic store Put as its op record,
// so after any crash either both exist or neither: a commit is never applied
// twice and never lost once acknowledged. Every end of one half message is
// serialised by a per-half lock and looks the op record up first, so a
// repeated END_TRANSACTION is answered success without storing again.
//
// A commit served inline (the common case, see Fast paths) whose final
// message stays in the real topic (not delayed) writes no op record: the
// final message, in the real topic, is its own op record, written in the
// same store round by construction (one record and three index entries
// fewer per commit). It is found by the UNIQ_KEY it shares with its half
// message, which the key index holds for QUERY_MESSAGE anyway: the outcome
// lookup tries the op record, then the real topic's records under that
// UNIQ_KEY stored since the half message (store times never decrease), then
// under commitKey(h), a key no KEYS value can be (it holds a space). A
// record found either way counts only if it is a committed message whose
// preparedTransactionOffset is the half message's physical offset. The
// final message is indexed under commitKey only when its UNIQ_KEY is not
// indexed (too long, or pushed out by the maximum number of index keys);
// stores written before the UNIQ_KEY form indexed every compact commit
// under commitKey, and commits that took the store path have op records:
// all are read alike. A final message with neither room for commitKey nor
// its UNIQ_KEY indexed gets an op record as before. One edge differs:
// deleting the real topic deletes the key with the final message, so a
// repeated commit after that finds the half message pending again.
//
// # Key index
//
// Half messages get no key index entries (two fewer keys per half
// message): the outcome lookup reads the op topic's and the real topic's
// keys, END_TRANSACTION and the checker find a half message by its
// physical offset or by scanning the half queue, and QUERY_MESSAGE finds
// the committed message in the real topic. A QUERY_MESSAGE on the half
// topic itself (Java indexes it) finds nothing; VIEW_MESSAGE_BY_ID on a
// half message's offset message id still works.
//
// # Check-back
//
// Every check interval (real time) the checker scans the half queue from
// its persisted progress: every half message below the progress is ended.
// Half messages younger than the transaction timeout (store time, on the
// broker's clock; CHECK_IMMUNITY_TIME_IN_SECONDS can lengthen it) are left
// for a later round; since store times never decrease along a queue, the
// first young message without immunity ends the round. An old enough
// pending half message that already had checkMax check-backs is discarded;
// otherwise, if a producer of its PGROUP group is online, its check count
// (kept per half message in store meta, not by re-appending the half
// message as Java does) is incremented durably and CHECK_TRANSACTION_STATE
// is sent oneway to one of the group's channels. With no producer online
// nothing is counted (a deviation from Java, which counts the attempt): the
// check is retried next round, so a producer that is down for a while does
// not lose its transactions. The progress only moves over a contiguous run
// of ended half messages, so a restart never skips a pending one.
//
// # Fast paths
//
// END_TRANSACTION needs the half message and its outcome so far. Both have
// a store path (the physical index and the message; the op record's key
// index) and an in-memory path for half messages this broker process
// stored itself, the common case:
//   - the record of each half message stored since the broker started is
//     kept (a copy, as stored: offsets and store time patched) until the
//     half message ends, within halfCacheBytes and a window of
//     halfWindowMax half queue offsets (found by the request's queue and
//     physical offsets); a record not kept is read from the store;
//   - every outcome of a half message at or above pendingFrom (the half
//     queue's end when the broker started, or when the outcome cache last
//     had room again) is in the outcome cache, so one missing from it is
//     pending without looking for an op record. An outcome that does not
//     fit in the cache turns this off until the checker's next prune.

const (
	// propTxState is the outcome an op record carries.
	propTxState = "RUNNEL_TX_STATE"
	// opTag is the tag of op records (Java TransactionalMessageUtil.REMOVE_TAG).
	opTag = "d"
	// txBatch is how many half messages a check round reads at once.
	txBatch = 64
	// maxEndedCache bounds the in-memory record of recently ended half
	// messages (beyond it the checker looks op records up in the store).
	maxEndedCache = 1 << 20
	// halfCacheBytes bounds the records of pending half messages kept in
	// memory for END_TRANSACTION (beyond it they are read from the store).
	halfCacheBytes = 32 << 20
	// halfCacheMaxRecord is the largest record kept there.
	halfCacheMaxRecord = 64 << 10
	// checkSendTimeout bounds the queueing of one CHECK_TRANSACTION_STATE.
	checkSendTimeout = 3 * time.Second
)

// Meta keys of the checker's durable state.
const (
	metaTxScan   = "tx/scan"    // next half queue offset not known to be ended (int64 BE)
	metaTxChecks = "tx/checks/" // + half queue offset (uint64 BE) → check-backs sent (int64 BE)
)

// Java's remarks for END_TRANSACTION requests that do not match their half
// message (EndTransactionProcessor.checkPrepareMessage).
const (
	remarkHalfNotFound  = "Find prepared transaction message failed"
	remarkWrongGroup    = "The producer group wrong"
	remarkWrongStateOff = "The transaction state table offset wrong"
	remarkWrongLogOff   = "The commit log offset wrong"
)

// txState is the outcome of a half message.
type txState byte

const (
	txPending txState = iota
	txCommitted
	txRolledBack
	txDiscarded
)

func (s txState) String() string {
	switch s {
	case txCommitted:
		return "commit"
	case txRolledBack:
		return "rollback"
	case txDiscarded:
		return "discard"
	}
	return "pending"
}

func parseTxState(v string) txState {
	switch v {
	case "commit":
		return txCommitted
	case "rollback":
		return txRolledBack
	case "discard":
		return txDiscarded
	}
	return txPending
}

// TransactionStats counts what the broker did with transactional messages
// since it started (not persisted; TRANS_CHECK_MAX_TIME_TOPIC durably holds
// every discarded half message).
type TransactionStats struct {
	Prepared   int64 // half messages stored
	Committed  int64 // half messages committed (repeats not counted)
	RolledBack int64 // half messages rolled back (repeats not counted)
	CheckBacks int64 // CHECK_TRANSACTION_STATE requests sent
	Discarded  int64 // half messages discarded after the max check count
}

// TransactionStats returns the transaction counters. Safe for concurrent
// use.
func (b *Broker) TransactionStats() TransactionStats {
	t := b.tx
	return TransactionStats{
		Prepared:   t.prepared.Load(),
		Committed:  t.committed.Load(),
		RolledBack: t.rolledBack.Load(),
		CheckBacks: t.checkBacks.Load(),
		Discarded:  t.discarded.Load(),
	}
}

// transactions serves END_TRANSACTION and runs the check-back loop. Safe
// for concurrent use; scanFrom is written only by the run goroutine.
type transactions struct {
	b   *Broker
	log *slog.Logger
	cfg txConfig

	prepared, committed, rolledBack, checkBacks, discarded atomic.Int64
	inlineEnds                                             atomic.Int64 // ended by processEndInline's store round (tests)

	// scanFrom is the check progress: every half message below it ended.
	scanFrom atomic.Int64

	mu struct {
		sync.Mutex
		// busy holds the half messages (by physical offset) being ended;
		// the channel is closed when the holder is done.
		busy map[int64]chan struct{}
		// ended caches the outcome of half messages at or above scanFrom,
		// so the checker rarely reads op records: ended[i] is that of
		// half queue offset endedBase+i (txPending: not known). A window
		// rather than a map: half messages end roughly in queue order,
		// so its accesses are neighbours.
		ended     []txState
		endedBase int64 // <= scanFrom
		// pendingFrom: every outcome of a half message at or above it
		// (and at or above scanFrom) is in ended (math.MaxInt64: none
		// known; see the file comment).
		pendingFrom int64
	}

	// ends pools the END_TRANSACTIONs in store rounds (pendingEnd).
	ends sync.Pool

	// halves holds the records of half messages stored by this process
	// and not ended yet (see the file comment), by half queue offset:
	// slots[i] is offset base+i. Half messages are stored in queue order
	// and mostly ended in it, so the window is short and its accesses are
	// neighbours (a map keyed by physical offset was a cache miss per
	// access).
	halves halfWindow
}

// halfWindow is transactions.halves.
type halfWindow struct {
	sync.Mutex
	base  int64
	slots []keptHalf
	bytes int
}

// keptHalf is the kept record of the half message at physical offset
// phys (rec nil: none).
type keptHalf struct {
	phys int64
	rec  []byte
}

// halfWindowMax bounds the half queue offsets the kept records span: a
// half message that stays pending that long (its producer died) is
// dropped from memory, so that it does not pin the window.
const halfWindowMax = 1 << 18

func newTransactions(b *Broker) *transactions {
	t := &transactions{b: b, log: b.log, cfg: b.cfg.tx}
	t.mu.busy = make(map[int64]chan struct{})
	t.mu.pendingFrom = math.MaxInt64
	t.ends.New = newPendingEnd
	return t
}

// ---- in-memory half messages ----

// halfStored is called by the send path once a half message's store round
// succeeded, with its record as stored (runs on the store's committer:
// never blocks).
func (t *transactions) halfStored(rec []byte, phys int64) {
	t.prepared.Add(1)
	if len(rec) > halfCacheMaxRecord || len(rec) < protocol.RecordQueueOffsetPos+8 {
		return
	}
	off := int64(binary.BigEndian.Uint64(rec[protocol.RecordQueueOffsetPos:]))
	h := &t.halves
	h.Lock()
	defer h.Unlock()
	if h.bytes+len(rec) > halfCacheBytes {
		return // read from the store when it ends
	}
	if len(h.slots) == 0 {
		h.base = off
	}
	if off < h.base {
		return // the window moved past it: read from the store when it ends
	}
	if off-h.base >= halfWindowMax {
		t.dropHalvesBelowLocked(off - halfWindowMax + 1)
		if len(h.slots) == 0 {
			h.base = off
		}
	}
	i := int(off - h.base)
	for len(h.slots) <= i {
		h.slots = append(h.slots, keptHalf{})
	}
	sl := &h.slots[i]
	h.bytes += len(rec) - len(sl.rec)
	sl.phys, sl.rec = phys, bytes.Clone(rec)
}

// dropHalvesBelowLocked forgets the kept records below half queue offset
// off. Requires t.halves.
func (t *transactions) dropHalvesBelowLocked(off int64) {
	h := &t.halves
	n := int(min(off-h.base, int64(len(h.slots))))
	for i := range n {
		h.bytes -= len(h.slots[i].rec)
		h.slots[i] = keptHalf{}
	}
	h.trimLocked(n)
	h.base = off
}

// trimLocked drops the window's first n slots (cleared). An emptied
// window keeps its array for the next half messages.
func (h *halfWindow) trimLocked(n int) {
	if n == len(h.slots) {
		h.slots = h.slots[:0]
	} else {
		h.slots = h.slots[n:]
	}
}

// cachedHalf returns the kept record of the half message at half queue
// offset off and physical offset phys.
func (t *transactions) cachedHalf(off, phys int64) ([]byte, bool) {
	h := &t.halves
	h.Lock()
	defer h.Unlock()
	i := off - h.base
	if i < 0 || i >= int64(len(h.slots)) {
		return nil, false
	}
	sl := h.slots[i]
	if sl.rec == nil || sl.phys != phys {
		return nil, false
	}
	return sl.rec, true
}

// forgetHalf drops the kept record of an ended half message (half queue
// offset off, physical offset phys).
func (t *transactions) forgetHalf(off, phys int64) {
	h := &t.halves
	h.Lock()
	defer h.Unlock()
	i := off - h.base
	if i < 0 || i >= int64(len(h.slots)) || h.slots[i].phys != phys || h.slots[i].rec == nil {
		return
	}
	h.bytes -= len(h.slots[i].rec)
	h.slots[i] = keptHalf{}
	// Move the window's front past records no longer kept.
	n := 0
	for n < len(h.slots) && h.slots[n].rec == nil {
		n++
	}
	h.trimLocked(n)
	h.base += int64(n)
}

// trackPending turns the known-pending fast path on from the half queue's
// current end (run at the checker's start and after a prune left the
// outcome cache room again).
func (t *transactions) trackPending() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.mu.pendingFrom != math.MaxInt64 || len(t.mu.ended) >= maxEndedCache/2 {
		// The window spans too many offsets: wait for a prune.
		return nil
	}
	// Read under t.mu: an outcome dropped from the cache (markEnded, under
	// t.mu) is then either before this read or seen as a full cache here.
	end, err := t.b.store.MaxOffset(topicTransHalf, 0)
	if err != nil {
		return err
	}
	t.mu.pendingFrom = end
	return nil
}

// ---- send path ----

// toHalf turns m into its half message form: REAL_TOPIC, REAL_QID and
// __transactionId__ = uniq set, transaction bits reset, topic and queue the
// half queue. It fails with MESSAGE_ILLEGAL when the properties grow too
// long.
func toHalf(m *InboundMessage, uniq string) error {
	b := make([]byte, 0, len(m.Properties)+len(m.Topic)+len(uniq)+64)
	b = protocol.AppendPropertiesExcept(b, m.Properties, protocol.PropRealTopic, protocol.PropRealQueueID, protocol.PropTransactionID)
	b = protocol.AppendProperty(b, protocol.PropTransactionID, uniq)
	b = protocol.AppendProperty(b, protocol.PropRealTopic, m.Topic)
	b = appendIntProperty(b, protocol.PropRealQueueID, int64(m.QueueID))
	if len(b) > protocol.MaxPropertiesLength {
		return illegal("message properties longer than 32767 after the half message's additions")
	}
	m.Properties = unsafe.String(unsafe.SliceData(b), len(b)) // b is never written again
	m.SysFlag = protocol.SetTransactionType(m.SysFlag, protocol.SysFlagTransactionNotType)
	m.Topic, m.QueueID = topicTransHalf, 0
	return nil
}

// ---- END_TRANSACTION ----

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

// processEndInline serves END_TRANSACTION on the connection's reader
// goroutine when it needs nothing that blocks: a half message this process
// keeps (not being ended by anyone else) whose outcome is known in memory
// is checked at once and its final message and op record go to the store's
// committer, which answers the request once they are stored. Anything
// else (another end of the same half message in progress, a record not
// kept or an outcome to look up in the store, a final message whose store
// path may block) is handed to a broker goroutine running processEnd.
func (t *transactions) processEndInline(ctx context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var h protocol.EndTransactionRequestHeader
	if err := h.Decode(req); err != nil {
		return respond(req, protocol.ResInvalidParameter, err.Error()), nil
	}
	if h.CommitOrRollback != protocol.SysFlagTransactionCommit && h.CommitOrRollback != protocol.SysFlagTransactionRollback {
		return t.processEnd(ctx, rc) // no response, as from Java
	}
	if !t.b.running() {
		return respond(req, protocol.ResServiceNotAvailable, "broker is shutting down"), nil
	}
	if t.b.isSlave() {
		return respond(req, protocol.ResSlaveNotAvailable, slaveRefusesEnd), nil
	}
	want := txRolledBack
	if h.CommitOrRollback == protocol.SysFlagTransactionCommit {
		want = txCommitted
	}
	if resp, ok := t.endInline(ctx, rc, &h, want); ok {
		return resp, nil
	}
	return t.handOffEnd(ctx, rc)
}

// endInline is processEndInline's non-blocking path. ok is false when
// nothing was done (the caller hands the request off); otherwise resp is
// the answer, or nil after rc.Defer (the store's committer answers).
func (t *transactions) endInline(ctx context.Context, rc *remoting.RequestCtx, h *protocol.EndTransactionRequestHeader, want txState) (resp *protocol.Command, ok bool) {
	req := rc.Request()
	phys := h.CommitLogOffset
	rec, kept := t.cachedHalf(h.TranStateTableOffset, phys)
	if !kept || !t.tryLock(phys) {
		return nil, false
	}
	locked := true
	defer func() {
		if locked {
			t.unlock(phys)
		}
	}()
	half, _, err := protocol.DecodeRecord(rec)
	if err != nil || half.CommitLogOffset != phys {
		return nil, false // processEnd reports it and reads the store
	}
	if err := checkHalf(&half, h); err != nil {
		return errorResponse(req, err), true
	}
	st, known := t.knownState(half.QueueOffset)
	if !known {
		return nil, false
	}
	if done, err := t.alreadyEnded(&half, st, want); done {
		if err != nil {
			return errorResponse(req, err), true
		}
		return protocol.NewResponse(req, protocol.ResSuccess, ""), true
	}
	pe := t.ends.Get().(*pendingEnd)
	pe.t = t
	msgs, err := t.endRecords(ctx, &half, want, rc, true, &pe.sc)
	if errors.Is(err, errEndMayBlock) {
		pe.release()
		return nil, false
	}
	if err != nil {
		pe.release()
		return errorResponse(req, err), true
	}
	pe.rc, pe.half, pe.want = rc, half, want
	rc.Defer()
	if err := pe.put(ctx, msgs, want == txCommitted && len(msgs) == 1); err != nil {
		_ = rc.Respond(errorResponse(req, storeError(err))) // a failure closed the connection, which reports it
		pe.release()
		return nil, true
	}
	locked = false // pe.done unlocks
	return nil, true
}

// pendingEnd is an END_TRANSACTION whose records are in a store round:
// done (on the store's committer) records the end, releases the half
// message and answers.
//
// They are pooled (transactions.ends): done releases its own.
type pendingEnd struct {
	t      *transactions
	rc     *remoting.RequestCtx
	half   protocol.MessageExt
	want   txState
	buf    *[]byte
	puts   [2]store.PutMessage
	res    [2]store.PutResult
	n      int // records in the round
	keys   [2][4]string
	sc     endScratch  // the records endRecords built
	doneFn func(error) // pe.done, bound once
}

func newPendingEnd() any {
	pe := &pendingEnd{}
	pe.doneFn = pe.done
	return pe
}

// release clears pe and returns it to the pool.
func (pe *pendingEnd) release() {
	t, done := pe.t, pe.doneFn
	*pe = pendingEnd{sc: endScratch{props: pe.sc.props[:0]}, doneFn: done} // the properties buffer is kept
	t.ends.Put(pe)
}

// put encodes msgs and hands them to the store's committer as one atomic
// round. With commit, msgs is the final message alone: its UNIQ_KEY index
// entry marks the commit; when that is not indexed, it is indexed under
// commitKey as well, or, when it has no room for another index key, an op
// record is stored with it. On error nothing was queued (done will not
// run).
func (pe *pendingEnd) put(ctx context.Context, msgs []*InboundMessage, commit bool) error {
	b := pe.t.b
	var finalKeys []string // the final message's keys, commitKey included
	if commit {
		finalKeys = appendIndexKeys(pe.keys[0][:0], msgs[0].Properties)
		// state finds the final message by its UNIQ_KEY when it is indexed.
		if uniq := pe.half.UniqKey(); uniq == "" || !slices.Contains(finalKeys, uniq) {
			if len(finalKeys) < store.MaxKeysPerMessage {
				finalKeys = append(finalKeys, commitKey(pe.half.QueueOffset))
			} else {
				msgs = append(msgs[:1:1], pe.t.opRecord(pe.half.QueueOffset, txCommitted))
			}
		}
	}
	pe.buf = b.getBuf()
	buf := (*pe.buf)[:0]
	var ends, ts [2]int
	for i, m := range msgs {
		var err error
		if buf, ts[i], err = b.encodeRecord(buf, m); err != nil {
			*pe.buf = buf
			b.putBuf(pe.buf)
			return err
		}
		ends[i] = len(buf)
	}
	*pe.buf = buf
	start := 0
	for i, m := range msgs {
		// Each message's keys on their own: the per-message cap must not
		// count the keys of the message before.
		keys := finalKeys
		if i > 0 || !commit {
			keys = appendIndexKeys(pe.keys[i][:0], m.Properties)
		}
		pe.puts[i] = store.PutMessage{
			Topic:             m.Topic,
			QueueID:           m.QueueID,
			Record:            buf[start:ends[i]:ends[i]],
			StoreTimestampPos: ts[i],
			TagsCode:          tagsCode(m.Properties),
			Keys:              keys,
		}
		start = ends[i]
	}
	n := len(msgs)
	pe.n = n
	if err := b.store.PutAsync(ctx, pe.puts[:n], pe.res[:n], pe.doneFn); err != nil {
		b.putBuf(pe.buf)
		return err
	}
	return nil
}

func (pe *pendingEnd) done(err error) {
	t, req := pe.t, pe.rc.Request()
	t.b.putBuf(pe.buf)
	var resp *protocol.Command
	if err != nil {
		resp = errorResponse(req, storeError(err))
	} else {
		t.ended(&pe.half, pe.want)
		t.inlineEnds.Add(1)
		resp = protocol.NewResponse(req, protocol.ResSuccess, "")
		props := ""
		if pe.want == txCommitted {
			props = pe.sc.final.Properties
		}
		if pe.n > 0 && t.b.syncMasterWait(props) {
			// Java's end waits for the replica, then answers SUCCESS
			// whatever the slave did.
			end := pe.res[pe.n-1].PhysicalOffset + int64(len(pe.puts[pe.n-1].Record))
			t.unlock(pe.half.CommitLogOffset)
			t.b.awaitReplica(end, pe.rc, resp, true)
			pe.release()
			return
		}
	}
	t.unlock(pe.half.CommitLogOffset)
	_ = pe.rc.Respond(resp) // a failure closed the connection, which reports it
	pe.release()
}

// handOffEnd serves the END_TRANSACTION rc on a goroutine the broker owns
// (processEnd), answering from there. It waits for a hand-off slot (shared
// with the send path) or for ctx, the connection's lifetime, to end.
func (t *transactions) handOffEnd(ctx context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	b := t.b
	select {
	case b.handOffs <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("broker: end transaction: %w", ctx.Err())
	}
	rc.Defer()
	// The remoting server joins its processors before stop joins b.wg, so
	// this Add never races with that Wait.
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		defer func() { <-b.handOffs }()
		if resp := t.endHandedOff(ctx, rc); resp != nil {
			_ = rc.Respond(resp) // a failure closed the connection, which reports it
		}
	}()
	return nil, nil
}

// endHandedOff runs processEnd, turning a panic into the response (as the
// remoting server does for its processors).
func (t *transactions) endHandedOff(ctx context.Context, rc *remoting.RequestCtx) (resp *protocol.Command) {
	req := rc.Request()
	defer func() {
		if r := recover(); r != nil {
			t.log.Error("broker: end transaction panicked", "panic", r, "stack", string(debug.Stack()))
			resp = respond(req, protocol.ResSystemError, fmt.Sprintf("broker: end transaction panic: %v", r))
		}
	}()
	resp, _ = t.processEnd(ctx, rc) // processEnd answers every error itself
	return resp
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

// ---- check-back ----

func txChecksKey(off int64) []byte {
	return binary.BigEndian.AppendUint64([]byte(metaTxChecks), uint64(off))
}

func (t *transactions) getMetaInt(key []byte) (int64, error) {
	v, ok, err := t.b.store.GetMeta(key)
	if err != nil || !ok {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("broker: transaction meta %q: %d bytes, want 8", key, len(v))
	}
	return int64(binary.BigEndian.Uint64(v)), nil
}

func (t *transactions) putMetaInt(key []byte, v int64) error {
	return t.b.store.PutMeta(key, binary.BigEndian.AppendUint64(nil, uint64(v)))
}

// run checks back pending half messages every check interval until ctx
// ends.
func (t *transactions) run(ctx context.Context) {
	if err := t.trackPending(); err != nil {
		t.log.Warn("broker: cannot read the half queue's end (retried next round)", "err", err)
	}
	tk := time.NewTicker(t.cfg.checkInterval)
	defer tk.Stop()
	loaded := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
		}
		if !loaded {
			p, err := t.getMetaInt([]byte(metaTxScan))
			if err != nil {
				t.log.Error("broker: transaction checker cannot read its progress; retrying", "err", err)
				continue
			}
			t.scanFrom.Store(p)
			loaded = true
		}
		if err := t.trackPending(); err != nil {
			t.log.Warn("broker: cannot read the half queue's end (retried next round)", "err", err)
		}
		if err := t.checkRound(ctx); err != nil && ctx.Err() == nil && t.b.running() {
			t.log.Warn("broker: transaction check-back round failed; retrying", "err", err)
		}
	}
}

// scannedHalf is a half message a check round read: ended when its
// outcome was known in memory (m is then left empty), else a copy of it.
type scannedHalf struct {
	off   int64
	ended bool
	m     protocol.MessageExt
}

// endedRunMax bounds the offsets endedRun looks at under t.mu at once.
const endedRunMax = 4096

// endedRun returns how many half messages from offset from on (below to,
// at most endedRunMax) have a cached outcome other than pending, one
// after the other.
func (t *transactions) endedRun(from, to int64) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if from < t.scanFrom.Load() {
		return 0 // outcomes below scanFrom are pruned: read the store
	}
	to = min(to, from+endedRunMax)
	off := from
	for off < to {
		if t.endedAt(off) == txPending {
			break
		}
		off++
	}
	return off - from
}

// readHalves returns up to txBatch half messages from offset (copies of
// those not known to have ended), and the offset after the scanned range.
func (t *transactions) readHalves(from int64) ([]scannedHalf, int64, error) {
	var out []scannedHalf
	next, err := t.b.store.Get(topicTransHalf, 0, from, txBatch, 0, func(rec []byte, _ int64) bool {
		m, _, err := protocol.DecodeRecord(rec)
		if err != nil {
			t.log.Error("broker: skipping undecodable half message", "err", err)
			return true
		}
		if st, ok := t.knownState(m.QueueOffset); ok && st != txPending {
			out = append(out, scannedHalf{off: m.QueueOffset, ended: true})
			return true
		}
		out = append(out, scannedHalf{off: m.QueueOffset, m: m.Clone()})
		return true
	})
	return out, next, err
}

// checkRound scans the half queue once (see the file comment) and
// persists how far every half message is known to have ended.
func (t *transactions) checkRound(ctx context.Context) error {
	maxOff, err := t.b.store.MaxOffset(topicTransHalf, 0)
	if err != nil {
		return err
	}
	from := t.scanFrom.Load()
	progress, contiguous := from, true
	now := t.b.now().UnixMilli()
	var roundErr error
	off := from
scan:
	for off < maxOff && ctx.Err() == nil {
		// A run of half messages whose outcomes are cached needs no read:
		// ended, as readHalves would report them.
		if n := t.endedRun(off, maxOff); n > 0 {
			if contiguous {
				progress = off + n
			}
			off += n
			continue
		}
		msgs, next, err := t.readHalves(off)
		if err != nil {
			roundErr = err
			break
		}
		for i := range msgs {
			h := &msgs[i]
			ended, stop, err := h.ended, false, error(nil)
			if !ended {
				ended, stop, err = t.checkOne(ctx, &h.m, now)
			}
			if err != nil {
				roundErr = errors.Join(roundErr, fmt.Errorf("half message %d: %w", h.off, err))
				contiguous = false
				continue
			}
			if stop {
				break scan
			}
			if !ended {
				contiguous = false
			} else if contiguous {
				progress = h.off + 1
			}
		}
		if contiguous {
			progress = max(progress, next) // undecodable records are skipped
		}
		if next <= off {
			break
		}
		off = next
	}
	if progress > from {
		if err := t.putMetaInt([]byte(metaTxScan), progress); err != nil {
			return errors.Join(roundErr, err)
		}
		t.scanFrom.Store(progress)
		t.prune(progress)
	}
	return roundErr
}

// prune forgets cached outcomes and check counts below progress.
func (t *transactions) prune(progress int64) {
	t.mu.Lock()
	t.pruneEndedLocked(progress)
	t.mu.Unlock()
	var stale [][]byte
	err := t.b.store.ScanMeta([]byte(metaTxChecks), func(k, _ []byte) bool {
		if len(k) != len(metaTxChecks)+8 || int64(binary.BigEndian.Uint64(k[len(metaTxChecks):])) < progress {
			stale = append(stale, append([]byte(nil), k...))
			return true
		}
		return false
	})
	for _, k := range stale {
		err = errors.Join(err, t.b.store.DeleteMeta(k))
	}
	if err != nil {
		t.log.Warn("broker: cannot delete old transaction check counts (retried next round)", "err", err)
	}
}

// checkOne handles one half message of a round: ended reports that it has
// an outcome (possibly given now, by a discard); stop that it is too young
// to be checked and so is every later one.
func (t *transactions) checkOne(ctx context.Context, m *protocol.MessageExt, nowMs int64) (ended, stop bool, err error) {
	st, err := t.state(m)
	if err != nil || st != txPending {
		return err == nil, false, err
	}
	age := nowMs - m.StoreTimestamp
	timeout := t.cfg.timeout.Milliseconds()
	if v, ok := m.Property(protocol.PropCheckImmunityTime); ok {
		if sec, err := strconv.ParseInt(v, 10, 64); err == nil && sec > 0 && sec < math.MaxInt64/1000 {
			if age < max(timeout, sec*1000) {
				return false, false, nil // immune for now; later ones may be due
			}
		} else if age < timeout {
			return false, false, nil
		}
	} else if age < timeout {
		return false, true, nil
	}
	count, err := t.getMetaInt(txChecksKey(m.QueueOffset))
	if err != nil {
		return false, false, err
	}
	if count >= int64(t.cfg.checkMax) {
		if err := t.discard(ctx, m, count); err != nil {
			return false, false, err
		}
		return true, false, nil
	}
	group, _ := m.Property(protocol.PropProducerGroup)
	conns := t.liveProducers(group)
	if len(conns) == 0 {
		return false, false, nil // no producer online: retried next round
	}
	count++
	if err := t.putMetaInt(txChecksKey(m.QueueOffset), count); err != nil {
		return false, false, err
	}
	t.sendCheck(ctx, m, count, conns)
	return false, false, nil
}

// liveProducers returns the open channels of a producer group in random
// order.
func (t *transactions) liveProducers(group string) []*remoting.ServerConn {
	f := t.b.ext.producerChannels
	if f == nil || group == "" {
		return nil
	}
	conns := f(group)
	live := conns[:0]
	for _, c := range conns {
		select {
		case <-c.Done():
		default:
			live = append(live, c)
		}
	}
	rand.Shuffle(len(live), func(i, j int) { live[i], live[j] = live[j], live[i] })
	return live
}

// checkRequest builds the CHECK_TRANSACTION_STATE of a half message: the
// body is the half message with its real topic and queue restored, all its
// properties and TRANSACTION_CHECK_TIMES = count.
func (t *transactions) checkRequest(m *protocol.MessageExt, count int64) (*protocol.Command, error) {
	topic, qid, err := realTarget(m)
	if err != nil {
		return nil, err
	}
	uniq := m.UniqKey()
	txID, ok := m.Property(protocol.PropTransactionID)
	if !ok {
		txID = uniq
	}
	props := protocol.AppendPropertiesExcept(make([]byte, 0, len(m.Properties)+32), m.Properties, protocol.PropTransactionCheckTimes)
	props = appendIntProperty(props, protocol.PropTransactionCheckTimes, count)
	body := *m
	body.Topic, body.QueueID, body.Properties = topic, qid, string(props)
	rec, err := body.AppendRecord(nil)
	if err != nil {
		return nil, err
	}
	cmd := protocol.NewRequest(protocol.ReqCheckTransactionState)
	h := protocol.CheckTransactionStateRequestHeader{
		Topic:                topicTransHalf,
		TranStateTableOffset: m.QueueOffset,
		CommitLogOffset:      m.CommitLogOffset,
		MsgID:                uniq,
		TransactionID:        txID,
		OffsetMsgID:          m.OffsetMsgID(),
		BrokerName:           t.b.brokerName(),
	}
	h.Encode(cmd)
	cmd.Body = rec
	return cmd, nil
}

// sendCheck sends the check-back oneway to the first of conns that takes
// it.
func (t *transactions) sendCheck(ctx context.Context, m *protocol.MessageExt, count int64, conns []*remoting.ServerConn) {
	cmd, err := t.checkRequest(m, count)
	if err != nil {
		t.log.Error("broker: cannot build a transaction check-back", "halfOffset", m.QueueOffset, "err", err)
		return
	}
	for _, c := range conns {
		sctx, cancel := context.WithTimeout(ctx, checkSendTimeout)
		err := c.InvokeOneway(sctx, cmd)
		cancel()
		if err == nil {
			t.checkBacks.Add(1)
			return
		}
		t.log.Debug("broker: transaction check-back not sent", "remote", c.RemoteAddr().String(), "err", err)
	}
}

// discard ends a half message that reached the max check count: a copy
// goes to TRANS_CHECK_MAX_TIME_TOPIC with its op record, atomically.
func (t *transactions) discard(ctx context.Context, m *protocol.MessageExt, count int64) error {
	unlock, err := t.lock(ctx, m.CommitLogOffset)
	if err != nil {
		return err
	}
	defer unlock()
	st, err := t.state(m)
	if err != nil || st != txPending {
		return err
	}
	if _, err := t.b.ensureTopic(ctx, topicTransCheckMax, 1, protocol.PermRead|protocol.PermWrite); err != nil {
		return err
	}
	props := protocol.AppendPropertiesExcept(make([]byte, 0, len(m.Properties)+32), m.Properties, protocol.PropTransactionCheckTimes)
	props = appendIntProperty(props, protocol.PropTransactionCheckTimes, count)
	cp := &InboundMessage{
		Topic:                     topicTransCheckMax,
		Flag:                      m.Flag,
		Body:                      m.Body,
		Properties:                string(props),
		SysFlag:                   m.SysFlag,
		BornTimestamp:             m.BornTimestamp,
		BornHost:                  m.BornHost,
		ReconsumeTimes:            m.ReconsumeTimes,
		MaxReconsumeTimes:         -1,
		PreparedTransactionOffset: m.CommitLogOffset,
	}
	if _, _, err := t.b.storeAll(ctx, cp, t.opRecord(m.QueueOffset, txDiscarded)); err != nil {
		return err
	}
	t.discarded.Add(1)
	t.markEnded(m.QueueOffset, txDiscarded)
	t.forgetHalf(m.QueueOffset, m.CommitLogOffset)
	t.log.Warn("broker: transactional half message discarded after the max check count",
		"halfOffset", m.QueueOffset, "uniqKey", m.UniqKey(), "checks", count, "topic", topicTransCheckMax)
	return nil
}
