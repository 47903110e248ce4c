// Check-back: the loop that scans pending half messages past their
// transaction timeout, asks a live producer of their group
// (CHECK_TRANSACTION_STATE), and discards those past the check limit.

package broker

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

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
