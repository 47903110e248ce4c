package state

import (
	"encoding/binary"
	"fmt"
	"iter"
	"slices"

	"github.com/runnel-dev/runnel/internal/invariants"
)

// TimeDomain says which clock a timer follows.
type TimeDomain uint8

const (
	// EventTime timers fire when the watermark passes them.
	EventTime TimeDomain = 1
	// ProcessingTime timers fire by the wall clock.
	ProcessingTime TimeDomain = 2
	// GroupEventTime timers belong to a key group, not a key (see
	// RegisterGroup); they fire like EventTime timers, and Timer.Key is
	// empty.
	GroupEventTime TimeDomain = 3
)

// numDomains sizes the per-domain arrays (indexed by TimeDomain).
const numDomains = 4

// validDomain reports whether d is a timer domain.
func validDomain(d TimeDomain) bool { return d >= EventTime && d <= GroupEventTime }

// Timer is a registered timer. Key is read-only: it shares the memory of
// the fired timer, which the Timers never use again, so the caller may keep
// it.
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
// key, with an empty value, so a key group's timers sort by time. A group
// timer (GroupEventTime, RegisterGroup) has an empty key part; its domain
// byte keeps it apart from a key's timer even for an empty key.
//
// A timer registered since the last Snapshot is pending: it is not in the
// write-back layer but in a list (added) that Snapshot writes into the layer
// being frozen (flush), without indexing it there (nothing reads timer keys
// through the layers: the set answers). A pending timer that fires or is
// deleted before the next Snapshot then costs the layer nothing; one that
// outlives it costs an append, not a layer map insert. A removed timer
// that is not pending is a deletion in the current layer, as before. A
// timer removed and registered again within one interval goes to the
// layer at once (the layer's deletion must not be left beside a flushed
// put of the same key): rmAt says at which timestamps that can happen.
//
// In memory each domain keeps one bucket per distinct timestamp, in a heap
// by timestamp. A bucket's keys are appended unsorted as timers register
// and sorted once when the bucket first comes due, so the common case of
// many keys with a timer at the same time (a window's end) costs an append
// to register and a slice step to fire, not a heap operation on long,
// mostly equal keys.
type Timers struct {
	h handle
	// set holds the layer keys of the registered timers; the value is 0
	// for a timer in a layer or the store, and gen<<32 | (1 + its index in
	// added) for a pending one (see pending).
	set map[string]uint64
	// added lists the pending timers' keys in registration order, "" for
	// one removed since; gen counts the Snapshots (flushes), from 1.
	added []string
	dead  int // the "" in added
	gen   uint64
	// rmAt[d] holds the timestamps at which a timer that was not pending
	// was removed since the last Snapshot (its deletion is in the current
	// layer), rmLast[d] the last of them (a cache).
	rmAt   [numDomains]map[int64]struct{}
	rmLast [numDomains]int64
	q      [numDomains]timerQueue // by domain
	// n counts the members of set by domain (index EventTime,
	// ProcessingTime), kept exact by every change of set so that Len is
	// O(1): the keyed task asks it for every message.
	n    [numDomains]int
	kbuf []byte
	// keys holds the set's keys, copied in chunks of keyChunk bytes (one
	// allocation per chunk, not per timer). A chunk is never written again
	// once a key is in it, so fired keys (Timer.Key) stay valid; it is
	// freed when none of its keys is referenced.
	keys       []byte
	sbuf, stmp []sortKey // sortKeys' scratch
}

// keyChunk is the size of the chunks timer keys are copied to: small, so
// that a long-lived timer keeps little memory of fired ones alive.
const keyChunk = 4 << 10

// intern returns k as a string in the key chunks.
func (t *Timers) intern(k []byte) string {
	if len(k) > keyChunk/4 {
		return string(k)
	}
	if cap(t.keys)-len(t.keys) < len(k) {
		t.keys = make([]byte, 0, keyChunk)
	}
	n := len(t.keys)
	t.keys = append(t.keys, k...)
	return unsafeString(t.keys[n:len(t.keys):len(t.keys)])
}

// timerQueue is one domain's timers: buckets by timestamp, and a min-heap
// of them.
type timerQueue struct {
	heap    []*timerBucket
	buckets map[int64]*timerBucket
	last    *timerBucket   // the bucket of the last registration (a cache)
	free    []*timerBucket // recycled buckets
}

// timerBucket holds the timers of one domain and timestamp.
type timerBucket struct {
	ts int64
	at int // index in the heap
	// keys are layer keys; keys[:next] were popped. keys[next:] may hold
	// deleted timers and duplicates (a timer deleted, then registered
	// again): the set says which are live.
	keys   []string
	next   int
	sorted bool // keys[next:] are in order
	live   int  // the bucket's timers in the set
}

// A queue recycles up to maxFreeBuckets buckets, keeping their key slices
// of up to maxFreeKeys.
const (
	maxFreeBuckets = 16
	maxFreeKeys    = 4096
)

// NewTimers registers the timer service name on b and loads its timers.
func NewTimers(b *Backend, name string) (*Timers, error) {
	h, err := newHandle(b, name, "timers", "v1", nil)
	if err != nil {
		return nil, err
	}
	t := &Timers{h: h, set: map[string]uint64{}, gen: 1}
	for kg := b.cfg.kgStart; kg < b.cfg.kgEnd; kg++ {
		err := b.scan(uint16(kg), h.prefix, func(sk, _ []byte) (bool, error) {
			rest := sk[len(h.prefix):]
			if len(rest) < 9 || !validDomain(TimeDomain(rest[0])) {
				return false, fmt.Errorf("%w: timers %s: malformed key", ErrDecode, name)
			}
			t.kbuf = appendLayerKey(t.kbuf[:0], uint16(kg), sk)
			if _, dup := t.set[string(t.kbuf)]; !dup {
				t.add(TimeDomain(rest[0]), decodeTS(rest[1:9]), t.intern(t.kbuf), 0)
			}
			return true, nil
		})
		if err != nil {
			return nil, err
		}
	}
	b.timers = append(b.timers, t)
	return t, nil
}

// pending reports whether set value v is a pending timer's, and its index
// in added.
func (t *Timers) pending(v uint64) (int, bool) {
	if v == 0 || v>>32 != t.gen {
		return 0, false
	}
	return int(v&(1<<32-1)) - 1, true
}

// removed records the removal of timer k (d, ts) whose set value was v:
// a pending timer leaves added, another one is deleted in the layer.
func (t *Timers) removed(d TimeDomain, ts int64, k []byte, v uint64) {
	if i, ok := t.pending(v); ok {
		t.added[i] = ""
		if t.dead++; t.dead > 1024 && t.dead > len(t.added)/2 {
			t.compactAdded()
		}
		return
	}
	t.h.b.cur.delTimer(k)
	if m := t.rmAt[d]; len(m) == 0 || t.rmLast[d] != ts {
		if m == nil {
			m = map[int64]struct{}{}
			t.rmAt[d] = m
		}
		m[ts] = struct{}{}
		t.rmLast[d] = ts
	}
}

// compactAdded drops the removed timers from added (renumbering the
// others in the set): without it, timers registered and removed again and
// again between two Snapshots would grow added without bound. It runs when
// more than half of added is removed, so it costs O(1) per removal.
func (t *Timers) compactAdded() {
	n := 0
	for _, k := range t.added {
		if k != "" {
			t.added[n] = k
			t.set[k] = t.gen<<32 | uint64(n+1)
			n++
		}
	}
	clear(t.added[n:])
	t.added, t.dead = t.added[:n], 0
}

// flush writes the pending timers into l, the current layer that Snapshot
// is about to freeze: each one put at most once, none of them in l before
// (see the type's comment), so l need not index them.
func (t *Timers) flush(l *layer) {
	for _, k := range t.added {
		if k != "" {
			l.appendTimer(k)
		}
	}
	clear(t.added)
	t.added, t.dead = t.added[:0], 0
	t.gen++
	for d := range t.rmAt {
		clear(t.rmAt[d])
	}
	if invariants.Enabled && t.gen >= 1<<32 {
		panic("state: timer generations overflow")
	}
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
	t.kbuf = t.appendKey(t.kbuf[:0], b.kg, d, ts)
	t.kbuf = append(t.kbuf, b.key...)
	return t.kbuf, nil
}

// appendKey appends the stored key of a timer without its key part.
func (t *Timers) appendKey(dst []byte, kg uint16, d TimeDomain, ts int64) []byte {
	dst = appendLayerKey(dst, kg, t.h.prefix)
	dst = append(dst, byte(d))
	return binary.BigEndian.AppendUint64(dst, uint64(ts)^(1<<63))
}

// groupKey returns the stored key of key group kg's group timer at ts.
func (t *Timers) groupKey(kg uint16, ts int64) ([]byte, error) {
	b := t.h.b
	if int(kg) < b.cfg.kgStart || int(kg) >= b.cfg.kgEnd {
		return nil, fmt.Errorf("%w: key group %d outside the backend's range", ErrInvalid, kg)
	}
	t.kbuf = t.appendKey(t.kbuf[:0], kg, GroupEventTime, ts)
	return t.kbuf, nil
}

// add indexes a timer that is not in the set, with set value v.
func (t *Timers) add(d TimeDomain, ts int64, k string, v uint64) {
	t.set[k] = v
	t.n[d]++
	q := &t.q[d]
	bk := q.last
	if bk == nil || bk.ts != ts {
		bk = q.buckets[ts]
		if bk == nil {
			bk = q.newBucket(ts)
		}
		q.last = bk
	}
	bk.live++
	switch {
	case !bk.sorted || k >= bk.keys[len(bk.keys)-1]:
		bk.keys = append(bk.keys, k)
	case bk.next == 0:
		bk.keys = append(bk.keys, k) // sorted again when it comes due
		bk.sorted = false
	default:
		// A timer registered at the time being fired: the rest stays in
		// order (it may pop next).
		i, _ := slices.BinarySearch(bk.keys[bk.next:], k)
		bk.keys = slices.Insert(bk.keys, bk.next+i, k)
	}
}

// Register adds a timer for the current key (a duplicate is a no-op).
func (t *Timers) Register(d TimeDomain, ts int64) error {
	k, err := t.timerKey(d, ts)
	if err != nil {
		return err
	}
	t.register(d, ts, k)
	return nil
}

// RegisterGroup adds the GroupEventTime timer of key group kg (in the
// backend's range) at ts; a duplicate is a no-op. It needs no current key.
// A group timer is state like the others: checkpointed and restored with
// its key group, so an operator can keep one timer per key group and time
// for state that many keys share (the window operator does, per window
// end) and find the keys another way when it fires.
func (t *Timers) RegisterGroup(kg uint16, ts int64) error {
	k, err := t.groupKey(kg, ts)
	if err != nil {
		return err
	}
	t.register(GroupEventTime, ts, k)
	return nil
}

// HasGroup reports whether key group kg has a group timer at ts.
func (t *Timers) HasGroup(kg uint16, ts int64) bool {
	k, err := t.groupKey(kg, ts)
	if err != nil {
		return false
	}
	_, ok := t.set[string(k)]
	return ok
}

// register adds timer k (d, ts) unless it is registered.
func (t *Timers) register(d TimeDomain, ts int64, k []byte) {
	if _, dup := t.set[string(k)]; dup {
		return
	}
	ks := t.intern(k)
	if m := t.rmAt[d]; len(m) != 0 {
		if _, ok := m[ts]; ok {
			// k may have been removed since the last Snapshot: its
			// deletion would be in the current layer.
			t.add(d, ts, ks, 0)
			t.h.b.cur.putTimer(k) // not in the set: no value visible
			return
		}
	}
	t.add(d, ts, ks, t.gen<<32|uint64(len(t.added)+1))
	t.added = append(t.added, ks)
	t.h.b.timerBytes += int64(len(k)) + 48
}

// Has reports whether the current key has a timer at ts in domain d
// (registered, and neither fired nor deleted). It is false without a
// current key or for an unknown domain.
func (t *Timers) Has(d TimeDomain, ts int64) bool {
	k, err := t.timerKey(d, ts)
	if err != nil {
		return false
	}
	_, ok := t.set[string(k)]
	return ok
}

// Delete removes the current key's timer (absent is a no-op).
func (t *Timers) Delete(d TimeDomain, ts int64) error {
	k, err := t.timerKey(d, ts)
	if err != nil {
		return err
	}
	v, ok := t.set[string(k)]
	if !ok {
		return nil
	}
	delete(t.set, string(k))
	t.n[d]--
	q := &t.q[d]
	if bk := q.buckets[ts]; bk != nil {
		bk.live--
		if bk.live == 0 {
			q.drop(bk)
		} else if stale := len(bk.keys) - bk.next - bk.live; stale > 64 && stale > bk.live {
			t.compact(bk)
		}
	}
	t.removed(d, ts, k, v)
	return nil
}

// compact drops the deleted timers and duplicates from bk's unpopped keys
// (leaving them sorted): a bucket holds at most about twice its live
// timers, however often timers are deleted and registered again.
func (t *Timers) compact(bk *timerBucket) {
	rest := bk.keys[bk.next:]
	if !bk.sorted {
		t.sortKeys(rest)
		bk.sorted = true
	}
	n := 0
	for i, k := range rest {
		if i > 0 && k == rest[i-1] {
			continue
		}
		if _, ok := t.set[k]; ok {
			rest[n] = k
			n++
		}
	}
	clear(rest[n:])
	bk.keys = bk.keys[:bk.next+n]
}

// sortKeys sorts the layer keys of one bucket with the checkpoint's sort
// (radixSortKeys): they share the timer name, domain and timestamp, so the
// sort prefix is their key group and the bytes past that shared header.
func (t *Timers) sortKeys(keys []string) {
	if len(keys) < 64 {
		slices.Sort(keys)
		return
	}
	hdr := 2 + len(t.h.prefix) + 9
	sk := t.sbuf[:0]
	for _, k := range keys {
		sk = append(sk, sortKey{pfx: groupPfx(k, hdr), key: k})
	}
	t.stmp = slices.Grow(t.stmp[:0], len(sk))[:len(sk)]
	radixSortKeys(sk, t.stmp)
	for i := range sk {
		keys[i] = sk[i].key
	}
	clear(sk)
	clear(t.stmp)
	t.sbuf = sk[:0]
	if invariants.Enabled && !slices.IsSorted(keys) {
		panic("state: timer keys out of order")
	}
}

// top returns the earliest bucket of domain d (nil: none).
func (t *Timers) top(d TimeDomain) *timerBucket {
	if !validDomain(d) || len(t.q[d].heap) == 0 {
		return nil
	}
	return t.q[d].heap[0]
}

// NextTimestamp returns the earliest timer's timestamp in domain d.
func (t *Timers) NextTimestamp(d TimeDomain) (int64, bool) {
	if bk := t.top(d); bk != nil {
		return bk.ts, true
	}
	return 0, false
}

// PopDue removes and returns the earliest timer of domain d with
// Timestamp <= upTo (ties by key group, then key); false when none is due.
// The caller typically calls SetCurrentKey(timer.Key) before using handles
// (a GroupEventTime timer has no key: only its KeyGroup).
func (t *Timers) PopDue(d TimeDomain, upTo int64) (Timer, bool, error) {
	bk := t.top(d)
	if bk == nil || bk.ts > upTo {
		return Timer{}, false, nil
	}
	if !bk.sorted {
		t.sortKeys(bk.keys[bk.next:])
		bk.sorted = true
	}
	// A live bucket has a live key among keys[next:].
	for {
		k := bk.keys[bk.next]
		bk.next++
		v, ok := t.set[k]
		if !ok {
			continue // deleted, or a duplicate already fired
		}
		delete(t.set, k)
		t.n[d]--
		ts := bk.ts
		bk.live--
		if bk.live == 0 {
			t.q[d].drop(bk)
		}
		kb := unsafeSlice(k)
		hdr := 2 + len(t.h.prefix) + 9
		if len(kb) < hdr {
			return Timer{}, false, fmt.Errorf("%w: timers %s: malformed key", ErrDecode, t.h.name)
		}
		t.removed(d, ts, kb, v)
		return Timer{
			Domain:    d,
			Timestamp: ts,
			KeyGroup:  binary.BigEndian.Uint16(kb),
			Key:       kb[hdr:len(kb):len(kb)],
		}, true, nil
	}
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
	if !validDomain(d) {
		return 0
	}
	if invariants.Enabled && invariants.Sometimes(1) {
		t.check(d)
	}
	return t.n[d]
}

// check verifies domain d's counts and buckets against the set
// (invariants only).
func (t *Timers) check(d TimeDomain) {
	if t.n[d] != t.count(d) {
		panic("state: timer count out of step with the timer set")
	}
	q := &t.q[d]
	live := 0
	for i, bk := range q.heap {
		if bk.at != i || q.buckets[bk.ts] != bk || bk.live <= 0 {
			panic("state: timer bucket out of place")
		}
		if i > 0 && q.heap[(i-1)/2].ts > bk.ts {
			panic("state: timer heap out of order")
		}
		if bk.sorted && !slices.IsSorted(bk.keys[bk.next:]) {
			panic("state: timer bucket out of order")
		}
		live += bk.live
	}
	if live != t.n[d] || len(q.buckets) != len(q.heap) {
		panic("state: timer buckets out of step with the timer set")
	}
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

// newBucket adds an empty bucket for ts.
func (q *timerQueue) newBucket(ts int64) *timerBucket {
	var bk *timerBucket
	if n := len(q.free); n > 0 {
		bk, q.free = q.free[n-1], q.free[:n-1]
	} else {
		bk = &timerBucket{}
	}
	bk.ts = ts
	if q.buckets == nil {
		q.buckets = map[int64]*timerBucket{}
	}
	q.buckets[ts] = bk
	bk.at = len(q.heap)
	q.heap = append(q.heap, bk)
	q.up(bk.at)
	return bk
}

// drop removes bucket bk (no live timers left) and recycles it.
func (q *timerQueue) drop(bk *timerBucket) {
	delete(q.buckets, bk.ts)
	if q.last == bk {
		q.last = nil
	}
	i := bk.at
	n := len(q.heap) - 1
	if i != n {
		q.swap(i, n)
	}
	q.heap[n] = nil
	q.heap = q.heap[:n]
	if i != n {
		if !q.down(i) {
			q.up(i)
		}
	}
	if len(q.free) == maxFreeBuckets {
		return
	}
	keys := bk.keys[:0]
	if cap(keys) > maxFreeKeys {
		keys = nil
	} else {
		clear(bk.keys[:cap(bk.keys)]) // let the keys go
	}
	*bk = timerBucket{keys: keys}
	q.free = append(q.free, bk)
}

func (q *timerQueue) swap(i, j int) {
	q.heap[i], q.heap[j] = q.heap[j], q.heap[i]
	q.heap[i].at, q.heap[j].at = i, j
}

func (q *timerQueue) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if q.heap[p].ts <= q.heap[i].ts {
			return
		}
		q.swap(i, p)
		i = p
	}
}

// down sifts element i down; it reports whether it moved.
func (q *timerQueue) down(i int) bool {
	i0, n := i, len(q.heap)
	for {
		c := 2*i + 1
		if c >= n {
			break
		}
		if r := c + 1; r < n && q.heap[r].ts < q.heap[c].ts {
			c = r
		}
		if q.heap[i].ts <= q.heap[c].ts {
			break
		}
		q.swap(i, c)
		i = c
	}
	return i > i0
}
