package state

import (
	"encoding/binary"
	"fmt"
	"time"
)

// The TTL sweep: expired entries leave the store whether or not anything
// reads them again.
//
// At every Snapshot a backend with TTL states examines the next
// WithTTLSweep committed entries of its key groups (a cursor that goes key
// group by key group and wraps around) and turns each expired TTL entry
// that memory does not shadow into a deletion in the layer it freezes: the
// deletion is part of that checkpoint's batch, like any other change, so a
// restore never sees state the checkpoint did not have. When the cursor
// leaves a key group in which it deleted something, the key group's range
// is compacted once the checkpoint is committed (checkpoint.Store.
// CompactState, on a goroutine of the store), so the tombstones drop the
// values from disk.
//
// The bound: with N committed entries in a subtask's key groups and a sweep
// of B entries per checkpoint, the cursor passes every entry within
// ceil(N/B)+1 checkpoints, so an entry stays on disk at most
//
//	TTL + (ceil(N/B) + 1) × checkpoint interval + one compaction
//
// after its last write (TestStateTTLSweepShrinksDisk measures it). The
// sweep reads the entries it examines from the store (block cache, then
// disk): B = DefaultTTLSweep costs a few milliseconds per checkpoint.
//
// Expiry is measured with the state's clock (WithTTL): processing time by
// default; WithEventTimeTTL measures it against the operator's watermark,
// which a checkpoint stores with the state, so a restore never resurrects
// or loses an entry the checkpoint's watermark did not expire.

// DefaultTTLSweep is the committed entries a backend examines per
// checkpoint for expired TTL entries (WithTTLSweep).
const DefaultTTLSweep = 4096

// WithTTLSweep sets how many committed entries the backend examines per
// snapshot for expired TTL entries (default DefaultTTLSweep; a negative n
// disables the sweep, leaving expired entries until they are read).
func WithTTLSweep(n int) BackendOption {
	return backendOptionFunc(func(c *backendConfig) {
		if n != 0 {
			c.ttlSweep = n
		}
	})
}

// WithEventTimeTTL is WithTTL measured in event time: an entry expires d
// after the watermark at its last write, once watermark() has passed that
// (watermark returns the operator's current event-time watermark).
func WithEventTimeTTL(d time.Duration, watermark func() time.Time) StateOption {
	return WithTTL(d, watermark)
}

type ttlSweep struct {
	kg      int    // key group the cursor is in (0: not started, else kg+1)
	after   []byte // the last state key examined in kg (nil: from its start)
	deleted int    // deletions in kg's current pass
	// compact lists key groups to compact once the snapshot that carried
	// their deletions is committed.
	compact []sweptGroup
	// Deleted counts expired entries the sweep removed (tests, metrics).
	total int64
	err   error
}

type sweptGroup struct {
	id uint64
	kg uint16
}

// SweptTTL returns how many expired entries the sweep has deleted, and the
// store error that stopped its last pass (tried again at the next
// snapshot; reads report the same error).
func (b *Backend) SweptTTL() (int64, error) { return b.sweep.total, b.sweep.err }

// sweepTTL is the Snapshot part of the sweep (see the top of the file).
func (b *Backend) sweepTTL(id uint64) {
	budget := b.cfg.ttlSweep
	if len(b.ttl) == 0 || budget <= 0 || b.cfg.kgStart == b.cfg.kgEnd {
		return
	}
	sw := &b.sweep
	if sw.kg == 0 {
		sw.kg = b.cfg.kgStart + 1
	}
	var lk []byte
	for visited := 0; budget > 0 && visited <= b.cfg.kgEnd-b.cfg.kgStart; {
		kg := uint16(sw.kg - 1)
		n, done, err := b.sweepGroup(kg, budget, &lk)
		budget -= n
		sw.err = err
		if err != nil {
			return // tried again at the next snapshot
		}
		if !done {
			return
		}
		if sw.deleted > 0 {
			sw.compact = append(sw.compact, sweptGroup{id: id, kg: kg})
		}
		sw.deleted, sw.after = 0, sw.after[:0]
		if sw.kg++; sw.kg > b.cfg.kgEnd {
			sw.kg = b.cfg.kgStart + 1
		}
		visited++
	}
}

// sweepGroup examines up to budget entries of kg after the cursor; done
// reports that it reached kg's end.
func (b *Backend) sweepGroup(kg uint16, budget int, lk *[]byte) (n int, done bool, err error) {
	sw := &b.sweep
	it, err := b.reader.NewIter(kg, nil)
	if err != nil {
		return 0, false, fmt.Errorf("state: %s: ttl sweep: %w", b.uid, err)
	}
	defer func() {
		if cerr := it.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("state: %s: ttl sweep: %w", b.uid, cerr)
		}
	}()
	valid := it.Valid()
	if len(sw.after) > 0 {
		valid = it.SeekGE(sw.after)
		if valid && string(it.Key()) == string(sw.after) {
			valid = it.Next()
		}
	}
	for ; valid && n < budget; valid = it.Next() {
		n++
		k := it.Key()
		sw.after = append(sw.after[:0], k...)
		nl, w := binary.Uvarint(k)
		if w <= 0 || uint64(len(k)-w) < nl {
			continue
		}
		cfg := b.ttl[unsafeString(k[w:w+int(nl)])]
		if cfg == nil {
			continue
		}
		v, err := it.Value()
		if err != nil {
			return n, false, fmt.Errorf("state: %s: ttl sweep: %w", b.uid, err)
		}
		if len(v) < 8 || !expired(v, cfg) {
			continue
		}
		*lk = appendLayerKey((*lk)[:0], kg, k)
		if b.shadowed(*lk) {
			continue // a newer write (or deletion) in memory decides
		}
		b.cur.del(*lk)
		sw.deleted++
		sw.total++
	}
	return n, !valid, nil
}

// shadowed reports whether a write-back layer has its own entry for key.
func (b *Backend) shadowed(key []byte) bool {
	if e, masked := b.cur.lookup(key); e != nil || masked {
		return true
	}
	for i := len(b.frozen) - 1; i >= 0; i-- {
		if e, masked := b.frozen[i].lookup(key); e != nil || masked {
			return true
		}
	}
	return false
}

// sweepCommitted asks the store to compact the key groups whose deletions
// checkpoint id (or an earlier one) carried.
func (b *Backend) sweepCommitted(id uint64) {
	sw := &b.sweep
	n := 0
	for n < len(sw.compact) && sw.compact[n].id <= id {
		b.store.CompactState(b.uid, sw.compact[n].kg)
		n++
	}
	sw.compact = append(sw.compact[:0], sw.compact[n:]...)
}
