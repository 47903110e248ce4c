package pipeline

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/runnel-dev/runnel/state"
)

// IntervalJoin joins the records of c's two inputs that have equal keys and
// event times within an interval of each other (Flink's interval join): a
// first-input record a and a second-input record b are joined when
//
//	a.ts + lower <= b.ts <= a.ts + upper
//
// and fn's result is emitted with the later of the two event times. It is
// an inner join; write outer joins with window.CoGroup or KeyedCoProcess.
//
// Each key's records wait in its keyed state until the watermark (the
// minimum over both inputs) makes a match impossible: a first-input record
// until the watermark reaches a.ts + upper, a second-input record until it
// reaches b.ts - lower; one event timer per key cleans them up. A record
// at or behind the watermark when it arrives is late: it is joined with
// nothing, counted in the operator's late records, and sent to the
// operator's dead-letter sink (OnError(DeadLetter(…))), or dropped. Each
// key's waiting records are read and written as one value per record: the
// operator suits keys with a moderate number of records within the
// interval. Records are encoded with the inputs' codecs (WithCodec; JSON by
// default). lower must not exceed upper.
func IntervalJoin[K comparable, A, B, OUT any](c *KeyedConnectedStreams[K, A, B], uid string, lower, upper time.Duration, fn func(ctx context.Context, a A, b B) (OUT, error), opts ...OperatorOption) *Stream[OUT] {
	j := c.a.s.n.job
	if lower > upper {
		j.errorf("IntervalJoin %q: lower bound %v above upper bound %v", uid, lower, upper)
	}
	if fn == nil {
		j.errorf("IntervalJoin %q: nil join function", uid)
	}
	ca, cb := recordCodec(c.a), recordCodec(c.b)
	codecs := fmt.Sprintf("op=interval-join;a=%s;b=%s", ca.ID(), cb.ID())
	return keyedOp(c.Tagged(uid), uid, kindProcess, codecs, func() KeyedProcessFunc[K, Either[A, B], OUT] {
		return &intervalJoin[K, A, B, OUT]{lower: int64(lower), upper: int64(upper), fn: fn, ca: ca, cb: cb}
	}, opts)
}

// intervalJoin keeps one state value per key: its waiting records of both
// inputs in arrival order, and its earliest pending cleanup timer.
//
//	timer (8, big-endian; math.MinInt64: none) | entry*
//	entry: side (1: 0 first input, 1 second) | ts (8) | uvarint(len) | record
type intervalJoin[K comparable, A, B, OUT any] struct {
	lower, upper int64
	fn           func(ctx context.Context, a A, b B) (OUT, error)
	ca           Codec[A]
	cb           Codec[B]
	buf          *state.Value[[]byte]
	scratch      []byte
	rec          []byte
}

// rawBytes is a codec whose Decode aliases the backend's slice: the join
// parses it before its next backend call.
type rawBytes struct{}

func (rawBytes) Append(dst []byte, b []byte) ([]byte, error) { return append(dst, b...), nil }
func (rawBytes) Decode(b []byte) ([]byte, error)             { return b, nil }
func (rawBytes) ID() string                                  { return "bytes" }

const joinHeader = 8

var errJoinCorrupt = errors.New("pipeline: interval join: corrupt buffer")

func (ij *intervalJoin[K, A, B, OUT]) Open(ctx *OpenContext) (err error) {
	ij.buf, err = state.NewValue(ctx.Backend(), "interval-join", state.Codec[[]byte](rawBytes{}))
	return err
}

// cleanup is when an entry of side second at ts can no longer match.
func (ij *intervalJoin[K, A, B, OUT]) cleanup(second bool, ts int64) int64 {
	if second {
		return satAddNs(ts, -ij.lower)
	}
	return satAddNs(ts, ij.upper)
}

func satAddNs(t, d int64) int64 {
	switch {
	case d > 0 && t > math.MaxInt64-d:
		return math.MaxInt64
	case d < 0 && t < math.MinInt64-d:
		return math.MinInt64
	}
	return t + d
}

// entries calls fn for each entry of buffer b.
func joinEntries(b []byte, fn func(second bool, ts int64, rec []byte) error) error {
	for len(b) > 0 {
		if len(b) < 9 {
			return errJoinCorrupt
		}
		second, ts := b[0] == 1, int64(binary.BigEndian.Uint64(b[1:9]))
		n, w := binary.Uvarint(b[9:])
		if w <= 0 || uint64(len(b)-9-w) < n {
			return errJoinCorrupt
		}
		rec := b[9+w : 9+w+int(n)]
		b = b[9+w+int(n):]
		if err := fn(second, ts, rec); err != nil {
			return err
		}
	}
	return nil
}

func appendJoinEntry(dst []byte, second bool, ts int64, rec []byte) []byte {
	side := byte(0)
	if second {
		side = 1
	}
	dst = append(dst, side)
	dst = binary.BigEndian.AppendUint64(dst, uint64(ts))
	dst = binary.AppendUvarint(dst, uint64(len(rec)))
	return append(dst, rec...)
}

func (ij *intervalJoin[K, A, B, OUT]) ProcessElement(ctx *KeyedContext[K, OUT], e Either[A, B]) error {
	ts, wm := ctx.ts, ctx.wm
	if ts <= wm {
		if e.Second {
			return ctx.LateRecord(e.B)
		}
		return ctx.LateRecord(e.A)
	}
	raw, ok, err := ij.buf.Get()
	if err != nil {
		return err
	}
	timer := int64(math.MinInt64)
	var ents []byte
	if ok {
		if len(raw) < joinHeader {
			return errJoinCorrupt
		}
		timer, ents = int64(binary.BigEndian.Uint64(raw)), raw[joinHeader:]
	}
	// Match against the other side's waiting records, and keep (in
	// scratch) those that can still match a later record: the watermark
	// prunes a busy key's records as they arrive, the cleanup timer a
	// quiet key's.
	lo, hi := satAddNs(ts, ij.lower), satAddNs(ts, ij.upper) // b.ts range for a first-input record
	if e.Second {
		lo, hi = satAddNs(ts, -ij.upper), satAddNs(ts, -ij.lower) // a.ts range for a second-input record
	}
	b := binary.BigEndian.AppendUint64(ij.scratch[:0], 0)
	err = joinEntries(ents, func(second bool, ots int64, rec []byte) error {
		if ij.cleanup(second, ots) > wm {
			b = appendJoinEntry(b, second, ots, rec)
		}
		if second == e.Second || ots < lo || ots > hi {
			return nil
		}
		var out OUT
		var err error
		if e.Second {
			a, derr := ij.ca.Decode(rec)
			if derr != nil {
				return fmt.Errorf("pipeline: interval join: decode first-input record: %w", derr)
			}
			out, err = ij.fn(ctx.uctx, a, e.B)
		} else {
			b, derr := ij.cb.Decode(rec)
			if derr != nil {
				return fmt.Errorf("pipeline: interval join: decode second-input record: %w", derr)
			}
			out, err = ij.fn(ctx.uctx, e.A, b)
		}
		if err != nil {
			return err
		}
		ctx.out.out++
		return ctx.emit(ctx.ctx, out, max(ts, ots))
	})
	ij.scratch = b
	if err != nil {
		return err
	}
	if ct := ij.cleanup(e.Second, ts); ct > wm {
		if e.Second {
			ij.rec, err = ij.cb.Append(ij.rec[:0], e.B)
		} else {
			ij.rec, err = ij.ca.Append(ij.rec[:0], e.A)
		}
		if err != nil {
			return fmt.Errorf("pipeline: interval join: encode record: %w", err)
		}
		b = appendJoinEntry(b, e.Second, ts, ij.rec)
		ij.scratch = b
		if timer == math.MinInt64 {
			timer = cleanupSlot(ct)
			if err := ctx.timers.Register(state.EventTime, timer); err != nil {
				return err
			}
		}
	}
	if len(b) == joinHeader {
		if !ok {
			return nil
		}
		return ij.buf.Clear() // the key's timer finds nothing
	}
	binary.BigEndian.PutUint64(b, uint64(timer))
	return ij.buf.Set(b)
}

// joinCleanupEvery is the granularity of the cleanup timers: a key has at
// most one, at a multiple of it, so that a busy key needs a timer per
// joinCleanupEvery of event time rather than per record. A quiet key's
// records stay at most that long after they can no longer match.
const joinCleanupEvery = int64(time.Second)

// cleanupSlot is the cleanup timer's time for a record that can no longer
// match once the watermark reaches ct.
func cleanupSlot(ct int64) int64 {
	r := ct % joinCleanupEvery
	if r < 0 {
		r += joinCleanupEvery
	}
	if r == 0 {
		return ct
	}
	return satAddNs(ct, joinCleanupEvery-r)
}

func (ij *intervalJoin[K, A, B, OUT]) OnTimer(ctx *KeyedContext[K, OUT], t Timer) error {
	raw, ok, err := ij.buf.Get()
	if err != nil || !ok {
		return err
	}
	if len(raw) < joinHeader {
		return errJoinCorrupt
	}
	if int64(binary.BigEndian.Uint64(raw)) != t.Time.UnixNano() {
		return nil // not the key's current timer (it was cleared and set again)
	}
	// Everything at or behind the watermark can no longer match (the
	// watermark may be past the firing timer's time).
	now := max(t.Time.UnixNano(), ctx.wm)
	b := binary.BigEndian.AppendUint64(ij.scratch[:0], 0)
	last := int64(math.MinInt64)
	err = joinEntries(raw[joinHeader:], func(second bool, ts int64, rec []byte) error {
		ct := ij.cleanup(second, ts)
		if ct <= now {
			return nil
		}
		last = max(last, ct)
		b = appendJoinEntry(b, second, ts, rec)
		return nil
	})
	ij.scratch = b
	if err != nil {
		return err
	}
	if len(b) == joinHeader {
		return ij.buf.Clear()
	}
	next := cleanupSlot(last)
	if err := ctx.timers.Register(state.EventTime, next); err != nil {
		return err
	}
	binary.BigEndian.PutUint64(b, uint64(next))
	return ij.buf.Set(b)
}
