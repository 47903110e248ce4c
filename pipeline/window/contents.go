package window

import (
	"fmt"

	"github.com/runnel-dev/runnel/internal/invariants"
	"github.com/runnel-dev/runnel/state"
)

// contents is how an operator keeps its windows' data: incremental
// accumulators or full contents. All methods act on the backend's current
// key; sw is the state window (for merging assigners, the window that holds
// the state of a possibly larger actual window).
type contents[K comparable, T, OUT any] interface {
	open(b *state.Backend) error
	// add adds v to sw; created reports that sw had no data before. empty
	// (nil: none) tells, without reading state, that sw has no data when it
	// returns true: it is asked only when memory does not know sw, so that
	// a new window costs no store read.
	add(sw span, v T, empty func(span) bool) (created bool, err error)
	// fire emits sw's results through out, with p.Firing set to its firing
	// index, and then drops the data (purge) or counts the firing. It
	// reports false when sw has no data. With first, a window that fired
	// before is left alone (a group timer firing again after a restore).
	fire(p *Pane[K], sw span, purge, first bool, out func(OUT) error) (bool, error)
	// merge moves src's data into dst.
	merge(dst, src span) error
	// clear drops sw's data.
	clear(sw span) error
	// windows appends the current key's windows with data to dst.
	windows(dst []span) ([]span, error)
	// entries calls fn with every key (encoded) and window with data in
	// key group kg.
	entries(kg uint16, fn func(kb []byte, w span) (bool, error)) error
	// check reports why the function cannot be used (nil: it can).
	check(merging bool) error
}

// incContents keeps one accumulator per key and window.
type incContents[K comparable, T, ACC, OUT any] struct {
	fn Function[T, ACC, OUT]
	m  *state.Map[span, accEntry[ACC]]
}

func (c *incContents[K, T, ACC, OUT]) check(merging bool) error {
	if c.fn.add == nil || c.fn.result == nil || c.fn.codec == nil {
		return fmt.Errorf("%w: zero or nil window function", ErrInvalid)
	}
	if merging && c.fn.merge == nil {
		return fmt.Errorf("%w: session windows need an aggregator implementing Merger", ErrInvalid)
	}
	return nil
}

func (c *incContents[K, T, ACC, OUT]) open(b *state.Backend) (err error) {
	c.m, err = state.NewMap(b, "window.acc", spanCodec{}, accEntryCodec[ACC]{c: c.fn.codec})
	return err
}

func (c *incContents[K, T, ACC, OUT]) add(sw span, v T, empty func(span) bool) (bool, error) {
	e, ok, err := getAbsent(c.m, sw, empty)
	if err != nil {
		return false, err
	}
	e.acc = c.fn.add(e.acc, ok, v)
	return !ok, c.m.Put(sw, e)
}

// getAbsent reads m's entry sw: from memory when it knows sw, else, unless
// empty says sw has no entry, from the store. Under invariants it sometimes
// checks empty's word against the state.
func getAbsent[V any](m *state.Map[span, V], sw span, empty func(span) bool) (V, bool, error) {
	if empty == nil {
		return m.Get(sw)
	}
	e, ok, known, err := m.GetBuffered(sw)
	if err != nil {
		return e, false, err
	}
	switch {
	case !known && !empty(sw):
		return m.Get(sw)
	case !known && invariants.Sometimes(10):
		// The store read notes the entry as absent (or not) itself.
		if e, ok, err = m.Get(sw); err != nil {
			return e, false, err
		}
		if ok {
			panic("window: a window known to be empty has state")
		}
	case !known:
		m.KnownAbsent() // a Put creates it fresh
	case invariants.Enabled && ok && invariants.Sometimes(10) && empty(sw):
		panic("window: a window known to be empty has state")
	}
	return e, ok, nil
}

func (c *incContents[K, T, ACC, OUT]) fire(p *Pane[K], sw span, purge, first bool, out func(OUT) error) (bool, error) {
	e, ok, err := c.m.Get(sw)
	if err != nil || !ok {
		return false, err
	}
	if first && e.fired > 0 {
		return true, nil
	}
	p.Firing = int(e.fired)
	if err := out(c.fn.result(e.acc)); err != nil {
		return true, err
	}
	if purge {
		return true, c.m.Delete(sw)
	}
	e.fired++
	return true, c.m.Put(sw, e)
}

func (c *incContents[K, T, ACC, OUT]) merge(dst, src span) error {
	s, ok, err := c.m.Get(src)
	if err != nil || !ok {
		return err
	}
	d, ok, err := c.m.Get(dst)
	if err != nil {
		return err
	}
	if ok {
		s = accEntry[ACC]{fired: max(s.fired, d.fired), acc: c.fn.merge(d.acc, s.acc)}
	}
	if err := c.m.Put(dst, s); err != nil {
		return err
	}
	return c.m.Delete(src)
}

func (c *incContents[K, T, ACC, OUT]) clear(sw span) error { return c.m.Delete(sw) }

func (c *incContents[K, T, ACC, OUT]) entries(kg uint16, fn func(kb []byte, w span) (bool, error)) error {
	return c.m.Entries(kg, fn)
}

func (c *incContents[K, T, ACC, OUT]) windows(dst []span) ([]span, error) {
	err := c.m.Range(func(w span, _ accEntry[ACC]) bool { dst = append(dst, w); return true })
	return dst, err
}

// procContents keeps every record of each key and window, one state entry
// per record, for a ProcessFunc.
type procContents[K comparable, T, OUT any] struct {
	fn    ProcessFunc[K, T, OUT]
	codec state.Codec[T]
	elems *state.Map[elemKey, T]
	meta  *state.Map[span, contentsMeta]
	buf   []T
	seqs  []uint64
}

func (c *procContents[K, T, OUT]) check(bool) error {
	if c.fn == nil || c.codec == nil {
		return fmt.Errorf("%w: nil process function or element codec", ErrInvalid)
	}
	return nil
}

func (c *procContents[K, T, OUT]) open(b *state.Backend) (err error) {
	if c.elems, err = state.NewMap(b, "window.elems", elemKeyCodec{}, c.codec); err != nil {
		return err
	}
	c.meta, err = state.NewMap(b, "window.contents", spanCodec{}, metaCodec{})
	return err
}

func (c *procContents[K, T, OUT]) add(sw span, v T, empty func(span) bool) (bool, error) {
	m, ok, err := getAbsent(c.meta, sw, empty)
	if err != nil {
		return false, err
	}
	if err := c.elems.Put(elemKey{w: sw, seq: m.next}, v); err != nil {
		return false, err
	}
	m.next++
	return !ok, c.meta.Put(sw, m)
}

// load reads sw's records into c.buf (and their sequence numbers into
// c.seqs), in order.
func (c *procContents[K, T, OUT]) load(sw span) error {
	clear(c.buf)
	c.buf, c.seqs = c.buf[:0], c.seqs[:0]
	return c.elems.Range(func(k elemKey, v T) bool {
		if k.w == sw {
			c.buf = append(c.buf, v)
			c.seqs = append(c.seqs, k.seq)
			return true
		}
		// Keys sort by window start, then end: stop past sw.
		return k.w.start < sw.start || k.w.start == sw.start && k.w.end < sw.end
	})
}

func (c *procContents[K, T, OUT]) fire(p *Pane[K], sw span, purge, first bool, out func(OUT) error) (bool, error) {
	m, ok, err := c.meta.Get(sw)
	if err != nil || !ok {
		return false, err
	}
	if first && m.fired > 0 {
		return true, nil
	}
	if err := c.load(sw); err != nil {
		return true, err
	}
	p.Firing = int(m.fired)
	var emitErr error
	err = c.fn(*p, c.buf, func(v OUT) {
		if emitErr == nil {
			emitErr = out(v)
		}
	})
	clear(c.buf)
	if err != nil {
		return true, err
	}
	if emitErr != nil {
		return true, emitErr
	}
	if purge {
		return true, c.clearLoaded(sw)
	}
	m.fired++
	return true, c.meta.Put(sw, m)
}

// clearLoaded deletes sw's records listed in c.seqs, and its meta entry.
func (c *procContents[K, T, OUT]) clearLoaded(sw span) error {
	for _, s := range c.seqs {
		if err := c.elems.Delete(elemKey{w: sw, seq: s}); err != nil {
			return err
		}
	}
	return c.meta.Delete(sw)
}

func (c *procContents[K, T, OUT]) merge(dst, src span) error {
	ms, ok, err := c.meta.Get(src)
	if err != nil || !ok {
		return err
	}
	md, _, err := c.meta.Get(dst)
	if err != nil {
		return err
	}
	if err := c.load(src); err != nil {
		return err
	}
	for i, v := range c.buf {
		if err := c.elems.Put(elemKey{w: dst, seq: md.next + uint64(i)}, v); err != nil {
			return err
		}
	}
	md.next += uint64(len(c.buf))
	md.fired = max(md.fired, ms.fired)
	clear(c.buf)
	if err := c.clearLoaded(src); err != nil {
		return err
	}
	return c.meta.Put(dst, md)
}

func (c *procContents[K, T, OUT]) clear(sw span) error {
	if err := c.load(sw); err != nil {
		return err
	}
	clear(c.buf)
	return c.clearLoaded(sw)
}

func (c *procContents[K, T, OUT]) entries(kg uint16, fn func(kb []byte, w span) (bool, error)) error {
	return c.meta.Entries(kg, fn)
}

func (c *procContents[K, T, OUT]) windows(dst []span) ([]span, error) {
	err := c.meta.Range(func(w span, _ contentsMeta) bool { dst = append(dst, w); return true })
	return dst, err
}
