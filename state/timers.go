package state

import (
	"container/heap"
	"encoding/binary"
	"fmt"
	"iter"

	"github.com/runnel-dev/runnel/internal/invariants"
)

// TimeDomain says which clock a timer follows.
type TimeDomain uint8

const (
	// EventTime timers fire when the watermark passes them.
	EventTime TimeDomain = 1
	// ProcessingTime timers fire by the wall clock.
	ProcessingTime TimeDomain = 2
)

// Timer is a registered timer. Key is the caller's copy.
type Timer struct {
	Domain    TimeDomain
	Timestamp int64
	KeyGroup  uint16
	Key       []byte
}

// Timers are per-key timers, persisted as state of the backend (so they are
// checkpointed and restored with it) and indexed in memory: NewTimers loads
// the timers of the backend's key groups from the store (one prefix scan per
// key group). Timestamps are in the caller's unit; (domain, timestamp, key)
// is unique. Not safe for concurrent use (see Backend).
//
// Stored key: keyGroup | name | domain(1) | timestamp (8 BE, sign flipped) |
// key, with an empty value, so a key group's timers sort by time.
type Timers struct {
	h     handle
	set   map[string]struct{} // layer keys of the registered timers
	heaps [3]timerHeap        // by domain; may hold deleted timers
	// n counts the members of set by domain (index EventTime,
	// ProcessingTime), kept exact by every change of set so that Len is
	// O(1): the keyed task asks it for every message.
	n    [3]int
	kbuf []byte
}

type timerItem struct {
	ts  int64
	key string // layer key: kg | name | domain | ts | user key
}

type timerHeap []timerItem

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	if h[i].ts != h[j].ts {
		return h[i].ts < h[j].ts
	}
	return h[i].key < h[j].key
}
func (h timerHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)   { *h = append(*h, x.(timerItem)) }
func (h *timerHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// NewTimers registers the timer service name on b and loads its timers.
func NewTimers(b *Backend, name string) (*Timers, error) {
	h, err := newHandle(b, name, "timers", "v1", nil)
	if err != nil {
		return nil, err
	}
	t := &Timers{h: h, set: map[string]struct{}{}}
	for kg := b.cfg.kgStart; kg < b.cfg.kgEnd; kg++ {
		err := b.scan(uint16(kg), h.prefix, func(sk, _ []byte) (bool, error) {
			rest := sk[len(h.prefix):]
			if len(rest) < 9 || (rest[0] != byte(EventTime) && rest[0] != byte(ProcessingTime)) {
				return false, fmt.Errorf("%w: timers %s: malformed key", ErrDecode, name)
			}
			k := string(appendLayerKey(nil, uint16(kg), sk))
			if _, dup := t.set[k]; !dup {
				t.set[k] = struct{}{}
				t.n[rest[0]]++
			}
			t.heaps[rest[0]] = append(t.heaps[rest[0]], timerItem{ts: decodeTS(rest[1:9]), key: k})
			return true, nil
		})
		if err != nil {
			return nil, err
		}
	}
	for d := range t.heaps {
		heap.Init(&t.heaps[d])
	}
	return t, nil
}

func decodeTS(b []byte) int64 { return int64(binary.BigEndian.Uint64(b) ^ (1 << 63)) }

func (t *Timers) timerKey(d TimeDomain, ts int64) ([]byte, error) {
	if d != EventTime && d != ProcessingTime {
		return nil, fmt.Errorf("%w: time domain %d", ErrInvalid, d)
	}
	if !t.h.b.hasKey {
		return nil, ErrNoCurrentKey
	}
	b := t.h.b
	t.kbuf = appendLayerKey(t.kbuf[:0], b.kg, t.h.prefix)
	t.kbuf = append(t.kbuf, byte(d))
	t.kbuf = binary.BigEndian.AppendUint64(t.kbuf, uint64(ts)^(1<<63))
	return append(t.kbuf, b.key...), nil
}

// Register adds a timer for the current key (a duplicate is a no-op).
func (t *Timers) Register(d TimeDomain, ts int64) error {
	k, err := t.timerKey(d, ts)
	if err != nil {
		return err
	}
	if _, dup := t.set[string(k)]; dup {
		return nil
	}
	ks := string(k)
	t.set[ks] = struct{}{}
	t.n[d]++
	heap.Push(&t.heaps[d], timerItem{ts: ts, key: ks})
	t.h.b.cur.put(k, nil)
	return nil
}

// Delete removes the current key's timer (absent is a no-op).
func (t *Timers) Delete(d TimeDomain, ts int64) error {
	k, err := t.timerKey(d, ts)
	if err != nil {
		return err
	}
	if _, ok := t.set[string(k)]; !ok {
		return nil
	}
	delete(t.set, string(k))
	t.n[d]--
	t.h.b.cur.del(k)
	return nil
}

// top drops deleted timers from the top of d's heap and returns the first
// live one.
func (t *Timers) top(d TimeDomain) (timerItem, bool) {
	if d != EventTime && d != ProcessingTime {
		return timerItem{}, false
	}
	h := &t.heaps[d]
	for h.Len() > 0 {
		it := (*h)[0]
		if _, ok := t.set[it.key]; ok {
			return it, true
		}
		heap.Pop(h)
	}
	return timerItem{}, false
}

// NextTimestamp returns the earliest timer's timestamp in domain d.
func (t *Timers) NextTimestamp(d TimeDomain) (int64, bool) {
	it, ok := t.top(d)
	return it.ts, ok
}

// PopDue removes and returns the earliest timer of domain d with
// Timestamp <= upTo; false when none is due. The caller typically calls
// SetCurrentKey(timer.Key) before using handles.
func (t *Timers) PopDue(d TimeDomain, upTo int64) (Timer, bool, error) {
	it, ok := t.top(d)
	if !ok || it.ts > upTo {
		return Timer{}, false, nil
	}
	heap.Pop(&t.heaps[d])
	delete(t.set, it.key)
	t.n[d]--
	k := unsafeBytes(it.key)
	hdr := 2 + len(t.h.prefix) + 9
	if len(k) < hdr {
		return Timer{}, false, fmt.Errorf("%w: timers %s: malformed key", ErrDecode, t.h.name)
	}
	t.h.b.cur.del(k)
	return Timer{
		Domain:    d,
		Timestamp: it.ts,
		KeyGroup:  binary.BigEndian.Uint16(k),
		Key:       append([]byte(nil), k[hdr:]...),
	}, true, nil
}

// Due yields (and removes) the due timers of domain d in timestamp order
// (ties by key group, then key). Timers registered during the iteration at
// or below upTo are yielded too. On an error it yields it and stops.
func (t *Timers) Due(d TimeDomain, upTo int64) iter.Seq2[Timer, error] {
	return func(yield func(Timer, error) bool) {
		for {
			tm, ok, err := t.PopDue(d, upTo)
			if err != nil {
				yield(Timer{}, err)
				return
			}
			if !ok || !yield(tm, nil) {
				return
			}
		}
	}
}

// Len returns the number of registered timers in domain d (0 for an
// unknown domain). O(1).
func (t *Timers) Len(d TimeDomain) int {
	if d != EventTime && d != ProcessingTime {
		return 0
	}
	if invariants.Enabled && invariants.Sometimes(1) && t.n[d] != t.count(d) {
		panic("state: timer count out of step with the timer set")
	}
	return t.n[d]
}

// count counts the registered timers of domain d by walking the set.
func (t *Timers) count(d TimeDomain) int {
	n := 0
	for k := range t.set {
		if len(k) > 2+len(t.h.prefix) && TimeDomain(k[2+len(t.h.prefix)]) == d {
			n++
		}
	}
	return n
}
