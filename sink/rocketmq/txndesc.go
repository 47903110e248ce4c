package rocketmq

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/runnel-dev/runnel/transport/client"
)

// ErrBadTxn is wrapped by the errors of Commit, Abort and Recover for a
// transaction description they cannot decode.
var ErrBadTxn = errors.New("rocketmq sink: bad transaction description")

// Transaction description (what PreCommit returns and the checkpoint
// stores), version 1:
//
//	"RX" 0x01
//	uvarint checkpointID, string run, uvarint epoch
//	uvarint dictionary size, then per entry: string producerGroup, topic,
//	    brokerName, brokerAddr
//	uvarint handle count, then per handle (in send order): uvarint
//	    dictionary index, uvarint lane, uvarint tranStateTableOffset,
//	    uvarint commitLogOffset, string msgID, string transactionID ("" =
//	    msgID)
//
// Version 2 (written when some half send of the epoch was retried) adds,
// after the handles: uvarint count, then per retried slot: uvarint slot
// (the handle's index), uvarint attempt (1-based) whose half message the
// broker acknowledged — what scale-out's check-back answers need to tell an
// orphan of an uncertain attempt from the accepted copy (TxnInfo).
//
// Version 3 (written once the sink observed its output queues) is version
// 2 with, in every dictionary entry after brokerAddr, uvarint queueID (the
// queue of topic its handles go to once committed) and uvarint floor + 1
// (0: unknown): an offset of that queue observed before the epoch was
// pre-committed, so that every committed copy of its half messages lies at
// or after it (what a restore scans, see restorecheck.go); the retried
// section is always present (count 0 when no send was retried).
//
// Strings are a uvarint length and the bytes. A handle takes about 45 bytes,
// so an epoch of 100k records describes itself in about 4.5 MB (the
// checkpoint store accepts up to checkpoint.MaxValueLen, 32 MiB).
const (
	txnVersion   = 1
	txnVersion2  = 2
	txnVersion3  = 3
	maxTxnString = 1024
)

// retriedSlot is a slot whose accepted half message came from a retry.
type retriedSlot struct {
	slot, try uint32
}

// txnHandle is one half message of a transaction and the commit lane it
// belongs to.
type txnHandle struct {
	h    client.TxHandle
	lane uint32
}

// txnDesc is a decoded transaction description.
type txnDesc struct {
	checkpoint uint64
	run        string
	epoch      uint64
	handles    []txnHandle
	retried    []retriedSlot
	// floors holds, per output queue of the handles, an offset below every
	// committed copy of them (version 3); nil when the description has none
	// (versions 1 and 2), and a queue it lacks has none.
	floors map[queueKey]int64
}

// queueKey names an output queue.
type queueKey struct {
	topic, broker string
	queue         int32
}

func queueOf(h *client.TxHandle) queueKey {
	return queueKey{topic: h.Topic, broker: h.BrokerName, queue: h.QueueID}
}

type dictKey struct {
	group, topic, brokerName, brokerAddr string
	queue                                int32 // version 3 only
}

func (d *txnDesc) dictKeyOf(h *client.TxHandle) dictKey {
	k := dictKey{group: h.ProducerGroup, topic: h.Topic, brokerName: h.BrokerName, brokerAddr: h.BrokerAddr}
	if d.floors != nil {
		k.queue = h.QueueID
	}
	return k
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// appendTxn appends the encoding of d to b: version 3 when d has floors,
// else version 2 when some send was retried, else version 1.
func appendTxn(b []byte, d *txnDesc) []byte {
	v := byte(txnVersion)
	switch {
	case d.floors != nil:
		v = txnVersion3
	case len(d.retried) > 0:
		v = txnVersion2
	}
	b = append(b, 'R', 'X', v)
	b = binary.AppendUvarint(b, d.checkpoint)
	b = appendString(b, d.run)
	b = binary.AppendUvarint(b, d.epoch)
	var dict []dictKey
	idx := make(map[dictKey]int, 2)
	for i := range d.handles {
		k := d.dictKeyOf(&d.handles[i].h)
		if _, ok := idx[k]; !ok {
			idx[k] = len(dict)
			dict = append(dict, k)
		}
	}
	b = binary.AppendUvarint(b, uint64(len(dict)))
	for _, k := range dict {
		b = appendString(b, k.group)
		b = appendString(b, k.topic)
		b = appendString(b, k.brokerName)
		b = appendString(b, k.brokerAddr)
		if v == txnVersion3 {
			b = binary.AppendUvarint(b, uint64(k.queue))
			f, ok := d.floors[queueKey{topic: k.topic, broker: k.brokerName, queue: k.queue}]
			if !ok || f < 0 {
				f = -1
			}
			b = binary.AppendUvarint(b, uint64(f+1))
		}
	}
	b = binary.AppendUvarint(b, uint64(len(d.handles)))
	for i := range d.handles {
		th := &d.handles[i]
		h := &th.h
		b = binary.AppendUvarint(b, uint64(idx[d.dictKeyOf(h)]))
		b = binary.AppendUvarint(b, uint64(th.lane))
		b = binary.AppendUvarint(b, uint64(h.TranStateTableOffset))
		b = binary.AppendUvarint(b, uint64(h.CommitLogOffset))
		b = appendString(b, h.MsgID)
		if h.TransactionID == h.MsgID {
			b = appendString(b, "")
		} else {
			b = appendString(b, h.TransactionID)
		}
	}
	if v != txnVersion {
		b = binary.AppendUvarint(b, uint64(len(d.retried)))
		for _, r := range d.retried {
			b = binary.AppendUvarint(b, uint64(r.slot))
			b = binary.AppendUvarint(b, uint64(r.try))
		}
	}
	return b
}

// txnReader decodes with a sticky error.
type txnReader struct {
	b   []byte
	err error
}

func (r *txnReader) uvarint(what string, limit uint64) uint64 {
	return r.uvarintOf(what, "", limit)
}

// uvarintOf reads a uvarint named what+suffix in its error (the names are
// joined only then: a description holds two strings per record).
func (r *txnReader) uvarintOf(what, suffix string, limit uint64) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = fmt.Errorf("%w: truncated %s%s", ErrBadTxn, what, suffix)
		return 0
	}
	if v > limit {
		r.err = fmt.Errorf("%w: %s%s %d above %d", ErrBadTxn, what, suffix, v, limit)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *txnReader) str(what string) string {
	b := r.raw(what)
	if len(b) == 0 {
		return ""
	}
	return string(b)
}

// raw reads a string without copying it (it aliases the description).
func (r *txnReader) raw(what string) []byte {
	n := r.uvarintOf(what, " length", maxTxnString)
	if r.err != nil {
		return nil
	}
	if uint64(len(r.b)) < n {
		r.err = fmt.Errorf("%w: truncated %s", ErrBadTxn, what)
		return nil
	}
	s := r.b[:n:n]
	r.b = r.b[n:]
	return s
}

// decodeTxn decodes a transaction description. It never panics; every
// count is checked against the bytes left before anything is allocated.
func decodeTxn(b []byte) (*txnDesc, error) {
	d, _, err := decodeTxnAs(b, true)
	return d, err
}

// decodeTxnAs is decodeTxn; without handles it checks every handle as
// decodeTxn does but keeps none (d.handles is nil), and returns their
// count: what txnInfo needs of a description every checkpoint, without
// allocating two strings per record.
func decodeTxnAs(b []byte, handles bool) (*txnDesc, int, error) {
	if len(b) < 3 || b[0] != 'R' || b[1] != 'X' {
		return nil, 0, fmt.Errorf("%w: no header", ErrBadTxn)
	}
	v := b[2]
	if v != txnVersion && v != txnVersion2 && v != txnVersion3 {
		return nil, 0, fmt.Errorf("%w: version %d (want %d to %d)", ErrBadTxn, v, txnVersion, txnVersion3)
	}
	r := &txnReader{b: b[3:]}
	d := &txnDesc{}
	d.checkpoint = r.uvarint("checkpoint id", 1<<63-1)
	d.run = r.str("run")
	d.epoch = r.uvarint("epoch", 1<<63-1)
	nd := r.uvarint("dictionary size", uint64(len(r.b))/4)
	dict := make([]dictKey, 0, nd)
	if v == txnVersion3 {
		d.floors = make(map[queueKey]int64, nd)
	}
	for range nd {
		k := dictKey{group: r.str("producer group"), topic: r.str("topic"), brokerName: r.str("broker name"), brokerAddr: r.str("broker address")}
		if v == txnVersion3 {
			k.queue = int32(r.uvarint("queue id", 1<<31-1))
			if f := r.uvarint("floor", 1<<63-1); f > 0 && r.err == nil {
				qk := queueKey{topic: k.topic, broker: k.brokerName, queue: k.queue}
				if old, ok := d.floors[qk]; !ok || int64(f-1) < old {
					d.floors[qk] = int64(f - 1)
				}
			}
		}
		dict = append(dict, k)
	}
	// A handle takes at least 6 bytes.
	nh := r.uvarint("handle count", uint64(len(r.b))/6)
	if r.err != nil {
		return nil, 0, r.err
	}
	if handles {
		d.handles = make([]txnHandle, 0, nh)
	}
	for range nh {
		di := r.uvarint("dictionary index", uint64(len(dict)))
		lane := r.uvarint("lane", 1<<16)
		tso := r.uvarint("tran state table offset", 1<<63-1)
		clo := r.uvarint("commit log offset", 1<<63-1)
		var id, tx string
		if handles {
			id, tx = r.str("msg id"), r.str("transaction id")
		} else {
			r.raw("msg id")
			r.raw("transaction id")
		}
		if r.err != nil {
			return nil, 0, r.err
		}
		if di >= uint64(len(dict)) {
			return nil, 0, fmt.Errorf("%w: dictionary index %d of %d", ErrBadTxn, di, len(dict))
		}
		if !handles {
			continue
		}
		if tx == "" {
			tx = id
		}
		k := dict[di]
		d.handles = append(d.handles, txnHandle{lane: uint32(lane), h: client.TxHandle{
			ProducerGroup: k.group, Topic: k.topic, BrokerName: k.brokerName, BrokerAddr: k.brokerAddr, QueueID: k.queue,
			TranStateTableOffset: int64(tso), CommitLogOffset: int64(clo), MsgID: id, TransactionID: tx,
		}})
	}
	if v != txnVersion {
		n := r.uvarint("retried slots", nh)
		for range n {
			sl := r.uvarint("retried slot", nh)
			try := r.uvarint("retried attempt", 1<<16)
			if r.err == nil && (sl >= nh || try < 2) {
				return nil, 0, fmt.Errorf("%w: retried slot %d attempt %d", ErrBadTxn, sl, try)
			}
			d.retried = append(d.retried, retriedSlot{slot: uint32(sl), try: uint32(try)})
		}
	}
	if r.err != nil {
		return nil, 0, r.err
	}
	if len(r.b) != 0 {
		return nil, 0, fmt.Errorf("%w: %d trailing bytes", ErrBadTxn, len(r.b))
	}
	return d, int(nh), nil
}
