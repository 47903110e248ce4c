package broker

import (
	"bytes"
	"encoding/binary"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/runnel-dev/runnel/transport/protocol"
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
//     half message ends, within the bytes WithTransactionHalfCache allows
//     and a window of halfWindowMax half queue offsets (found by the
//     request's queue and physical offsets); a record not kept is read
//     from the store;
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
	if h.bytes+len(rec) > t.cfg.halfCache {
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

// END_TRANSACTION is in transaction_end.go and transaction_endinline.go,
// check-back in transaction_check.go.
