package state

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/runnel-dev/runnel/checkpoint"
	"github.com/runnel-dev/runnel/internal/invariants"
)

var (
	// ErrInvalid is returned for invalid arguments (bad names, parallelism).
	ErrInvalid = errors.New("state: invalid argument")
	// ErrNoCurrentKey is returned by handle calls before SetCurrentKey.
	ErrNoCurrentKey = errors.New("state: no current key")
)

// DefaultWriteBufferLimit is the default size of the write-back layers above
// which WantsCheckpoint reports true.
const DefaultWriteBufferLimit = 64 << 20

// DefaultReadCacheSize is the default size of the cache of committed values.
const DefaultReadCacheSize = 32 << 20

// MaxNameLen bounds state names.
const MaxNameLen = 255

// Backend holds the keyed state of one keyed operator subtask. It is NOT
// safe for concurrent use: one goroutine (the subtask's) calls
// SetCurrentKey, the handles, Snapshot, Committed and Aborted. The Part that
// Snapshot returns is the exception: its WriteTo may run on the checkpoint
// committer's goroutine while the subtask keeps processing (it reads only
// frozen layers, which nothing modifies).
//
// Reads go: current changes, then frozen changes (newest first), then the
// cache of committed values, then the committed data in the store. Nothing
// is written to the store except by a Part inside checkpoint.Store.Commit.
type Backend struct {
	store  *checkpoint.Store
	reader *checkpoint.StateReader
	uid    string
	maxP   int
	cfg    backendConfig

	cur    *layer
	frozen []*layer // oldest first; still to be confirmed committed
	// spare is a committed layer kept to become the next current layer
	// (its map, slices and arena are reused: a checkpoint interval's
	// changes then allocate nothing), nil when none. A committed layer
	// that a newer snapshot's Part also holds waits in held until the
	// outcome (Committed or Aborted) of a snapshot id >= heldUntil says
	// that no Commit reads that Part any more.
	spare     *layer
	held      *layer
	heldUntil uint64
	// cache holds committed values: its entries equal the store's (every
	// newer change is in frozen or cur), so the first read of a key after
	// a checkpoint costs a map lookup instead of a Pebble read. Committed
	// merges the committed layers into it; store reads fill it.
	cache  readCache
	lastID uint64

	key     []byte // current key
	keyPart []byte // uvarint(len(key)) | key
	kg      uint16
	hasKey  bool
	epoch   uint64 // bumped by SetCurrentKey: handles cache their keys

	// timers are the backend's timer services: Snapshot writes their
	// pending timers into the layer it freezes; timerBytes estimates the
	// size of those (counted in BufferedBytes).
	timers     []*Timers
	timerBytes int64

	rbuf   []byte            // committed reads
	states map[string]string // name -> "kind=codec"
	ttl    map[string]*stateConfig
	sweep  ttlSweep // ttlsweep.go
}

// NewBackend returns the backend of operatorUID's subtask on store. It reads
// the committed state lazily (nothing is scanned up front).
func NewBackend(store *checkpoint.Store, operatorUID string, maxParallelism int, opts ...BackendOption) (*Backend, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: nil store", ErrInvalid)
	}
	if operatorUID == "" || len(operatorUID) > checkpoint.MaxUIDLen {
		return nil, fmt.Errorf("%w: operator UID length %d", ErrInvalid, len(operatorUID))
	}
	if maxParallelism < 1 || maxParallelism > MaxMaxParallelism {
		return nil, fmt.Errorf("%w: max parallelism %d (1..%d)", ErrInvalid, maxParallelism, MaxMaxParallelism)
	}
	cfg := backendConfig{kgStart: 0, kgEnd: maxParallelism, bufferLimit: DefaultWriteBufferLimit, cacheSize: DefaultReadCacheSize, ttlSweep: DefaultTTLSweep}
	for _, o := range opts {
		o.apply(&cfg)
	}
	if cfg.kgStart < 0 || cfg.kgStart > cfg.kgEnd || cfg.kgEnd > maxParallelism {
		return nil, fmt.Errorf("%w: key group range [%d, %d) of %d", ErrInvalid, cfg.kgStart, cfg.kgEnd, maxParallelism)
	}
	return &Backend{
		store:  store,
		reader: store.NewStateReader(operatorUID),
		uid:    operatorUID,
		maxP:   maxParallelism,
		cfg:    cfg,
		cur:    newLayer(0),
		cache:  readCache{limit: cfg.cacheSize},
		states: map[string]string{},
		ttl:    map[string]*stateConfig{},
	}, nil
}

// OperatorUID returns the operator the backend belongs to.
func (b *Backend) OperatorUID() string { return b.uid }

// MaxParallelism returns the number of key groups.
func (b *Backend) MaxParallelism() int { return b.maxP }

// KeyGroupRange returns the key groups [start, end) of this backend.
func (b *Backend) KeyGroupRange() (start, end uint16) {
	return uint16(b.cfg.kgStart), uint16(b.cfg.kgEnd)
}

// SetCurrentKey selects the key (and its key group) that handles act on. The
// backend copies key.
func (b *Backend) SetCurrentKey(key []byte) {
	b.SetCurrentKeyGroup(key, KeyGroup(key, b.maxP))
}

// SetCurrentKeyGroup is SetCurrentKey for a caller that already computed the
// key group (it must equal KeyGroup(key, MaxParallelism())).
func (b *Backend) SetCurrentKeyGroup(key []byte, keyGroup uint16) {
	if invariants.Enabled && keyGroup != KeyGroup(key, b.maxP) {
		panic("state: SetCurrentKeyGroup with the wrong key group")
	}
	b.key = append(b.key[:0], key...)
	b.keyPart = append(binary.AppendUvarint(b.keyPart[:0], uint64(len(key))), key...)
	b.kg = keyGroup
	b.hasKey = true
	b.epoch++
}

// CurrentKey returns the current key (owned by the backend; do not modify).
func (b *Backend) CurrentKey() []byte { return b.key }

// CurrentKeyGroup returns the current key's key group.
func (b *Backend) CurrentKeyGroup() uint16 { return b.kg }

// ClearCurrentKey leaves the backend without a current key: until the next
// SetCurrentKey, handles and timers return ErrNoCurrentKey (a broadcast
// record's function has no key).
func (b *Backend) ClearCurrentKey() {
	b.hasKey = false
	b.epoch++
}

// register records a state name; names are unique per backend.
func (b *Backend) register(name, kind, codecID string, cfg *stateConfig) ([]byte, error) {
	if name == "" || len(name) > MaxNameLen {
		return nil, fmt.Errorf("%w: state name length %d (1..%d)", ErrInvalid, len(name), MaxNameLen)
	}
	if _, dup := b.states[name]; dup {
		return nil, fmt.Errorf("%w: state %q registered twice", ErrInvalid, name)
	}
	if cfg != nil && cfg.ttl < 0 {
		return nil, fmt.Errorf("%w: negative TTL", ErrInvalid)
	}
	b.states[name] = kind + "=" + codecID
	if cfg != nil && cfg.ttl > 0 {
		if cfg.clock == nil {
			cfg.clock = time.Now
		}
		b.ttl[name] = cfg
	}
	return append(binary.AppendUvarint(nil, uint64(len(name))), name...), nil
}

// Codecs returns "name:kind=codecID;…" of the states registered so far,
// sorted by name: the Codecs field of the operator's checkpoint.OperatorInfo.
func (b *Backend) Codecs() string {
	parts := make([]string, 0, len(b.states))
	for n, c := range b.states {
		parts = append(parts, n+":"+c)
	}
	slices.Sort(parts)
	return strings.Join(parts, ";")
}

// layerKey appends keyGroup | stateKey parts to dst.
func appendLayerKey(dst []byte, kg uint16, parts ...[]byte) []byte {
	dst = binary.BigEndian.AppendUint16(dst, kg)
	for _, p := range parts {
		dst = append(dst, p...)
	}
	return dst
}

// get reads a layer key through the layers and the store. The returned
// slice is valid until the next backend call.
func (b *Backend) get(key []byte) ([]byte, bool, error) {
	if v, ok, known := b.getMem(key); known {
		return v, ok, nil
	}
	var ok bool
	var err error
	b.rbuf, ok, err = b.reader.AppendValue(b.rbuf[:0], binary.BigEndian.Uint16(key), key[2:])
	if err != nil {
		return nil, false, fmt.Errorf("state: %s: %w", b.uid, err)
	}
	slot := b.cache.put(unsafeString(key), b.rbuf, ok)
	b.cur.noteMiss(key, slot, b.cache.gen, !ok)
	return b.rbuf, ok, nil
}

// getMem is get as far as memory knows: the write-back layers, then the
// read cache. known false means that only the store can tell. A key the
// current layer lacks is noted as its miss (layer.noteMiss), so that a Set
// after the Get inserts without another lookup.
func (b *Backend) getMem(key []byte) (val []byte, ok, known bool) {
	if e, masked := b.cur.lookup(key); e != nil || masked {
		return entryVal(e)
	}
	for i := len(b.frozen) - 1; i >= 0; i-- {
		if e, masked := b.frozen[i].lookup(key); e != nil || masked {
			// The frozen entry's cache slot names the same key: a Set
			// after this Get then updates the cache at Committed
			// without a lookup.
			var slot, gen uint32
			if e != nil {
				slot, gen = e.cslot, e.cgen
			}
			b.cur.noteMiss(key, slot, gen, e == nil || e.del)
			return entryVal(e)
		}
	}
	if v, ok, slot, hit := b.cache.getSlot(key); hit {
		b.cur.noteMiss(key, slot, b.cache.gen, !ok)
		return v, ok, true
	}
	return nil, false, false
}

// entryVal is the value of a layer's entry (nil: masked by a range
// deletion), known in either case.
func entryVal(e *entry) ([]byte, bool, bool) {
	if e == nil || e.del {
		return nil, false, true
	}
	return e.val, true, true
}

// inCurrent returns the current layer's own put of key, if any.
func (b *Backend) inCurrent(key []byte) bool {
	e, _ := b.cur.lookup(key)
	return e != nil && !e.del
}

// scan calls fn, in key order, with every visible entry of keyGroup whose
// state key starts with prefix: the layers merged over the store. fn gets
// the state key (without the key group) and the value, both valid only
// during the call; fn must not modify state (collect, then modify).
func (b *Backend) scan(kg uint16, prefix []byte, fn func(stateKey, val []byte) (bool, error)) error {
	lo := appendLayerKey(nil, kg, prefix)
	hi := prefixEnd(lo)
	los, his := string(lo), string(hi)
	layers := make([]*layer, 0, 1+len(b.frozen)) // newest first
	layers = append(layers, b.cur)
	for i := len(b.frozen) - 1; i >= 0; i-- {
		layers = append(layers, b.frozen[i])
	}
	var runs [][]string
	for _, l := range layers {
		for _, r := range l.runs() {
			i := searchStrings(r, los)
			j := len(r)
			if hi != nil {
				j = searchStrings(r, his)
			}
			if i < j {
				runs = append(runs, r[i:j])
			}
		}
	}
	it, err := b.reader.NewIter(kg, prefix)
	if err != nil {
		return fmt.Errorf("state: %s: %w", b.uid, err)
	}
	defer func() { _ = it.Close() }()
	kbuf := make([]byte, 2, 64)
	binary.BigEndian.PutUint16(kbuf, kg)
	for {
		// The smallest key among the runs and the store.
		var minKey string
		have := false
		for _, r := range runs {
			if len(r) > 0 && (!have || r[0] < minKey) {
				minKey, have = r[0], true
			}
		}
		storeAt := false
		if it.Valid() {
			kbuf = append(kbuf[:2], it.Key()...)
			if ks := unsafeString(kbuf); !have || ks <= minKey {
				if !have || ks < minKey {
					minKey = strings.Clone(ks)
				}
				have, storeAt = true, true
			}
		}
		if !have {
			return nil
		}
		// Resolve it newest first.
		var val []byte
		visible, decided := false, false
		for _, l := range layers {
			if e, masked := l.lookup(unsafeBytes(minKey)); e != nil || masked {
				if e != nil && !e.del {
					val, visible = e.val, true
				}
				decided = true
				break
			}
		}
		if !decided && storeAt {
			v, err := it.Value()
			if err != nil {
				return fmt.Errorf("state: %s: %w", b.uid, err)
			}
			val, visible = v, true
		}
		if visible {
			ok, err := fn(unsafeBytes(minKey)[2:], val)
			if err != nil || !ok {
				return err
			}
		}
		for i, r := range runs {
			for len(r) > 0 && r[0] == minKey {
				r = r[1:]
			}
			runs[i] = r
		}
		if storeAt {
			it.Next()
		}
	}
}

func searchStrings(r []string, k string) int {
	lo, hi := 0, len(r)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if r[m] < k {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

func unsafeBytes(s string) []byte {
	if s == "" {
		return nil
	}
	return unsafeSlice(s)
}

// Snapshot freezes the changes made since the previous Snapshot and returns
// them as the checkpoint Part of checkpoint id (which must be above every
// earlier snapshot id). Reads keep seeing the frozen changes until
// Committed. The Part also carries every older snapshot not yet Committed
// (in flight or Aborted), so committing id alone is always complete. It
// costs O(1) plus expiring the TTL entries among the changes.
func (b *Backend) Snapshot(id uint64) checkpoint.Part {
	if invariants.Enabled && id <= b.lastID && b.lastID != 0 {
		panic("state: snapshot ids must increase")
	}
	b.lastID = id
	for _, t := range b.timers {
		t.flush(b.cur)
	}
	b.timerBytes = 0
	b.sweepTTL(id) // ttlsweep.go: expired committed entries, read or not
	b.expireCurrent()
	b.cur.id = id
	b.frozen = append(b.frozen, b.cur)
	if b.spare != nil {
		b.cur, b.spare = b.spare, nil
		b.cur.reuse()
	} else {
		b.cur = newLayer(b.frozen[len(b.frozen)-1].index.len())
	}
	return &part{uid: b.uid, layers: slices.Clone(b.frozen)}
}

// expireCurrent turns expired TTL entries of the current layer into
// deletions.
func (b *Backend) expireCurrent() {
	if len(b.ttl) == 0 {
		return
	}
	for i := range b.cur.ents.len() {
		e := b.cur.ents.at(uint32(i))
		k := e.key
		if e.del || e.gone || len(k) < 3 {
			continue
		}
		n, w := binary.Uvarint(unsafeBytes(k[2:]))
		if w <= 0 || uint64(len(k)-2-w) < n {
			continue
		}
		cfg := b.ttl[k[2+w:2+w+int(n)]]
		if cfg == nil || len(e.val) < 8 {
			continue
		}
		if expired(e.val, cfg) {
			b.cur.bytes -= int64(len(e.val))
			e.val, e.del = nil, true
		}
	}
}

// Committed tells the backend that checkpoint id is durable: the frozen
// changes of id and older snapshots are dropped from memory. Once the
// outcome of id is told (Committed or Aborted), the Parts of id and older
// snapshots must not be written any more: the backend reuses their memory.
func (b *Backend) Committed(id uint64) {
	n := 0
	for n < len(b.frozen) && b.frozen[n].id <= id {
		n++
	}
	if invariants.Enabled && n > 0 && invariants.Sometimes(20) {
		b.checkDurable(b.frozen[n-1])
	}
	for _, l := range b.frozen[:n] {
		b.cache.merge(l)
	}
	b.sweepCommitted(id) // ttlsweep.go
	b.release(id)
	if n > 0 && b.frozen[n-1].ents.len() <= maxLayerHint {
		if b.lastID <= id {
			b.spare = b.frozen[n-1] // no Part in flight holds it
		} else {
			b.held, b.heldUntil = b.frozen[n-1], b.lastID
		}
	}
	clear(b.frozen[:n])
	b.frozen = b.frozen[n:]
}

// checkDurable verifies that a committed layer's puts are in the store
// unless a newer layer has its own verdict on the key (invariants only).
func (b *Backend) checkDurable(l *layer) {
	newer := []*layer{b.cur}
	for _, f := range b.frozen {
		if f.id > l.id {
			newer = append(newer, f)
		}
	}
	checked := 0
	n := l.ents.len()
outer:
	for j := range n {
		if checked == 8 {
			return
		}
		// From a start that varies with the layer, so that checks reach
		// every part of a layer over time.
		i := uint32((uint64(j) + l.id*7919) % uint64(n))
		e := l.ents.at(i)
		if e.del || e.gone {
			continue
		}
		if at, ok := l.indexFind(e.key); !ok || at != i {
			continue // not indexed (a timer key Snapshot appended)
		}
		key := unsafeBytes(e.key)
		for _, nl := range newer {
			if e, masked := nl.lookup(key); e != nil || masked {
				continue outer
			}
		}
		v, ok, err := b.store.GetState(b.uid, binary.BigEndian.Uint16(key), key[2:])
		if err == nil && (!ok || string(v) != string(l.ents.at(i).val)) {
			panic("state: a committed change is not in the store")
		}
		checked++
	}
}

// Aborted tells the backend that checkpoint id failed. Its frozen changes
// stay visible (under newer changes) and are written again by the next
// Snapshot's Part.
func (b *Backend) Aborted(id uint64) { b.release(id) }

// release makes the held layer spare once the outcome of checkpoint id
// covers every Part that held it.
func (b *Backend) release(id uint64) {
	if b.held != nil && id >= b.heldUntil {
		b.spare, b.held = b.held, nil
	}
}

// BufferedBytes returns the approximate size of the write-back layers
// (current and frozen).
func (b *Backend) BufferedBytes() int64 {
	n := b.cur.bytes + b.timerBytes
	for _, l := range b.frozen {
		n += l.bytes
	}
	return n
}

// CachedBytes returns the approximate size of the cache of committed
// values (WithReadCacheSize bounds it: past the bound it is emptied).
func (b *Backend) CachedBytes() int64 { return b.cache.bytes }

// WantsCheckpoint reports that the changes made since the last Snapshot
// exceed the limit set by WithWriteBufferLimit: the runtime should take a
// checkpoint now. That is how the write-back layer spills: its changes
// reach the store only through a checkpoint's batch, which keeps them
// atomic with the offsets. (Frozen layers are not counted: they are in a
// checkpoint already, and a new one would not shrink them.)
func (b *Backend) WantsCheckpoint() bool { return b.cur.bytes+b.timerBytes > b.cfg.bufferLimit }

// part is the checkpoint.Part of one snapshot: the frozen layers it covers,
// written oldest first.
type part struct {
	uid    string
	layers []*layer
}

// SizeHint implements checkpoint.PartSizer: the layers' keys and values,
// each key with its store prefix and the batch's record header.
func (p *part) SizeHint() int {
	n := 0
	for _, l := range p.layers {
		n += int(l.bytes) + l.ents.len()*(len(p.uid)+8)
	}
	return max(n, 0)
}

func (p *part) WriteTo(w *checkpoint.Writer) error {
	for _, l := range p.layers {
		for _, r := range l.ranges {
			kg := binary.BigEndian.Uint16(unsafeBytes(r.from))
			if err := w.DeleteStateRange(p.uid, kg, unsafeBytes(r.from)[2:], unsafeBytes(r.to)[2:]); err != nil {
				return err
			}
		}
		// In key order: Pebble inserts a sorted batch into its memtable
		// much cheaper than a random one (each insert starts from the
		// previous one's position), which pays for the sort.
		for _, sk := range sortedEntries(l) {
			i := sk.i
			key := unsafeBytes(sk.key)
			kg := binary.BigEndian.Uint16(key)
			var err error
			if e := l.ents.at(i); e.del {
				err = w.DeleteState(p.uid, kg, key[2:])
			} else {
				err = w.PutState(p.uid, kg, key[2:], e.val)
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}
