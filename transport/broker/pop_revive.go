package broker

import (
	"container/heap"
	"context"
	"encoding/binary"
	"fmt"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/runnel-dev/runnel/transport/broker/internal/store"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// POP checkpoints: their durable records (meta keys "pop/ck/…"), the
// in-memory index (by id and by revive time) and the revive loop.

// ckID names a checkpoint: one pop of one queue (or one invisible-time
// change), as a receipt handle names it.
type ckID struct {
	group, topic string
	queue        int32
	start        int64 // the pop's start offset (the handle's ckQueueOffset)
	popTime      int64 // ms
}

// popCK is a checkpoint: the offsets a pop handed out, a bit per acked
// one, and when the rest is revived.
type popCK struct {
	id        ckID
	invisible int64 // ms
	reviveQid int32
	offsets   []int64 // at most popMaxMsgs
	acked     uint32  // bit i: offsets[i] acked
	index     int     // in the due heap, -1 when not in it
}

func (c *popCK) reviveAt() int64 { return c.id.popTime + c.invisible }

func (c *popCK) allAcked() bool { return bits.OnesCount32(c.acked) == len(c.offsets) }

const ckPrefix = "pop/ck/"

// key is ckPrefix, group, 0, topic, 0, queue, start and pop time (big
// endian): names are validated and hold no 0 byte.
func (id ckID) key() []byte {
	k := make([]byte, 0, len(ckPrefix)+len(id.group)+len(id.topic)+2+4+16)
	k = append(k, ckPrefix...)
	k = append(k, id.group...)
	k = append(k, 0)
	k = append(k, id.topic...)
	k = append(k, 0)
	k = binary.BigEndian.AppendUint32(k, uint32(id.queue))
	k = binary.BigEndian.AppendUint64(k, uint64(id.start))
	return binary.BigEndian.AppendUint64(k, uint64(id.popTime))
}

func parseCKKey(k []byte) (ckID, bool) {
	rest, ok := strings.CutPrefix(string(k), ckPrefix)
	if !ok {
		return ckID{}, false
	}
	i := strings.IndexByte(rest, 0)
	if i < 0 {
		return ckID{}, false
	}
	j := strings.IndexByte(rest[i+1:], 0)
	if j < 0 {
		return ckID{}, false
	}
	id := ckID{group: rest[:i], topic: rest[i+1 : i+1+j]}
	tail := []byte(rest[i+1+j+1:])
	if len(tail) != 20 {
		return ckID{}, false
	}
	id.queue = int32(binary.BigEndian.Uint32(tail))
	id.start = int64(binary.BigEndian.Uint64(tail[4:]))
	id.popTime = int64(binary.BigEndian.Uint64(tail[12:]))
	return id, true
}

const (
	ckVersion = 2
	ackPrefix = "pop/ak/"
)

// ackKey names the durable record of one ack: ackPrefix, the
// checkpoint's key suffix and the acked offset. Acks are records of their
// own (as Java's ACK messages beside its CK messages), so concurrent acks
// of one checkpoint never overwrite each other's bits.
func (id ckID) ackKey(off int64) []byte {
	k := id.key()
	k = append([]byte(ackPrefix), k[len(ckPrefix):]...)
	return binary.BigEndian.AppendUint64(k, uint64(off))
}

// parseAckKey returns the checkpoint and offset an ack key names.
func parseAckKey(k []byte) (ckID, int64, bool) {
	rest, ok := strings.CutPrefix(string(k), ackPrefix)
	if !ok || len(rest) < 8 {
		return ckID{}, 0, false
	}
	id, ok := parseCKKey([]byte(ckPrefix + rest[:len(rest)-8]))
	return id, int64(binary.BigEndian.Uint64([]byte(rest[len(rest)-8:]))), ok
}

// value encodes the immutable part: version, invisible time, revive
// queue, offset count, offsets.
func (c *popCK) value() []byte {
	v := make([]byte, 0, 1+8+4+1+8*len(c.offsets))
	v = append(v, ckVersion)
	v = binary.BigEndian.AppendUint64(v, uint64(c.invisible))
	v = binary.BigEndian.AppendUint32(v, uint32(c.reviveQid))
	v = append(v, byte(len(c.offsets)))
	for _, o := range c.offsets {
		v = binary.BigEndian.AppendUint64(v, uint64(o))
	}
	return v
}

func decodeCK(id ckID, v []byte) (*popCK, error) {
	if len(v) < 14 || v[0] != ckVersion {
		return nil, fmt.Errorf("broker: pop checkpoint %v: bad record", id)
	}
	c := &popCK{id: id, index: -1}
	c.invisible = int64(binary.BigEndian.Uint64(v[1:]))
	c.reviveQid = int32(binary.BigEndian.Uint32(v[9:]))
	n := int(v[13])
	if n == 0 || n > popMaxMsgs || len(v) != 14+8*n {
		return nil, fmt.Errorf("broker: pop checkpoint %v: bad record length", id)
	}
	for i := range n {
		c.offsets = append(c.offsets, int64(binary.BigEndian.Uint64(v[14+8*i:])))
	}
	return c, nil
}

// syncMeta reports whether POP bookkeeping is fsynced before it is
// answered: with the broker's SYNC flush, as its messages are.
func (p *popService) syncMeta() bool { return p.b.cfg.flushMode == FlushSync }

// ensureLoaded loads the checkpoints and acks of the store once (after a
// restart); acks whose checkpoint is gone (acked in full or revived while
// they were written) are deleted.
func (p *popService) ensureLoaded() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mu.loaded {
		return nil
	}
	if p.b.store == nil {
		return errPopClosed
	}
	var bad []error
	err := p.b.store.ScanMeta([]byte(ckPrefix), func(k, v []byte) bool {
		id, ok := parseCKKey(k)
		if !ok {
			bad = append(bad, fmt.Errorf("broker: pop checkpoint key %q", k))
			return true
		}
		c, err := decodeCK(id, v)
		if err != nil {
			bad = append(bad, err)
			return true
		}
		p.mu.cks[id] = c
		return true
	})
	var orphans [][]byte
	if err == nil {
		err = p.b.store.ScanMeta([]byte(ackPrefix), func(k, _ []byte) bool {
			id, off, ok := parseAckKey(k)
			c := p.mu.cks[id]
			if !ok || c == nil || !c.markAcked(off) {
				orphans = append(orphans, slices.Clone(k))
			}
			return true
		})
	}
	if err == nil {
		err = p.loadModesLocked() // pop_assign.go
	}
	if err == nil {
		mb := p.b.store.NewMetaBatch()
		for _, k := range orphans {
			mb.DeleteMeta(k)
		}
		for id, c := range p.mu.cks {
			if c.allAcked() { // the deletion of an acked checkpoint was lost
				deleteCK(mb, c)
				delete(p.mu.cks, id)
				continue
			}
			heap.Push(&p.mu.due, c)
		}
		err = mb.Commit(false)
	}
	if err != nil {
		return fmt.Errorf("broker: loading pop checkpoints: %w", err)
	}
	for _, e := range bad {
		p.b.log.Error("broker: pop checkpoint skipped", "err", e)
	}
	if len(p.mu.cks) > 0 {
		p.b.log.Info("broker: pop checkpoints loaded", "count", len(p.mu.cks))
	}
	p.mu.loaded = true
	return nil
}

// markAcked sets the ack bit of off; false when c has no such offset or
// it was acked already.
func (c *popCK) markAcked(off int64) bool {
	i := slices.Index(c.offsets, off)
	if i < 0 || c.acked&(1<<i) != 0 {
		return false
	}
	c.acked |= 1 << i
	return true
}

// deleteCK adds the deletion of c and of its acks to mb.
func deleteCK(mb *store.MetaBatch, c *popCK) {
	mb.DeleteMeta(c.id.key())
	for i, off := range c.offsets {
		if c.acked&(1<<i) != 0 {
			mb.DeleteMeta(c.id.ackKey(off))
		}
	}
}

// putCK adds c to mb; index indexes it once mb was committed.
func putCK(mb *store.MetaBatch, c *popCK) { mb.PutMeta(c.id.key(), c.value()) }

// index makes c known (for acks and revive).
func (p *popService) index(c *popCK) {
	c.index = -1
	p.mu.Lock()
	if old, ok := p.mu.cks[c.id]; ok && old.index >= 0 {
		heap.Remove(&p.mu.due, old.index)
	}
	p.mu.cks[c.id] = c
	heap.Push(&p.mu.due, c)
	p.mu.Unlock()
}

// ack marks off (of checkpoint id) acked and adds its record to mb (the
// checkpoint's deletion when it is acked in full). An ack of no known
// checkpoint (already revived or acked) does nothing, as on a Java
// broker.
func (p *popService) ack(mb *store.MetaBatch, id ckID, off int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.mu.cks[id]
	if !ok || !c.markAcked(off) {
		return
	}
	if !c.allAcked() {
		mb.PutMeta(id.ackKey(off), nil)
		return
	}
	delete(p.mu.cks, id)
	if c.index >= 0 {
		heap.Remove(&p.mu.due, c.index)
	}
	deleteCK(mb, c)
}

// commitAcks writes the acks of mb; a failure is logged (the messages are
// revived later: delivered again, never lost) and returned.
func (p *popService) commitAcks(mb *store.MetaBatch, group, topic string) error {
	err := mb.Commit(p.syncMeta())
	if err != nil {
		p.b.log.Warn("broker: pop ack not stored", "group", group, "topic", topic, "err", err)
	}
	return err
}

// reviveLoop revives due checkpoints every reviveInterval until ctx ends.
func (p *popService) reviveLoop(ctx context.Context) {
	t := time.NewTicker(p.cfg.reviveInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := p.ensureLoaded(); err != nil {
			if ctx.Err() == nil {
				p.b.log.Warn("broker: pop revive", "err", err)
			}
			continue
		}
		p.reviveDue(ctx)
	}
}

// reviveDue revives every checkpoint whose invisible time passed: each
// un-acked message is stored again in the group's pop retry topic, its
// reconsume count up (Java PopReviveService.reviveRetry), then the
// checkpoint is deleted. A checkpoint whose revive fails stays for the
// next round.
func (p *popService) reviveDue(ctx context.Context) {
	now := p.nowMS()
	for ctx.Err() == nil {
		p.mu.Lock()
		if len(p.mu.due) == 0 || p.mu.due[0].reviveAt() > now {
			p.mu.Unlock()
			return
		}
		c := heap.Pop(&p.mu.due).(*popCK)
		delete(p.mu.cks, c.id)
		p.mu.Unlock()
		if err := p.revive(ctx, c); err != nil {
			p.b.log.Warn("broker: pop revive failed; trying again", "group", c.id.group, "topic", c.id.topic,
				"queue", c.id.queue, "err", err)
			p.mu.Lock()
			if _, again := p.mu.cks[c.id]; !again {
				c.index = -1
				p.mu.cks[c.id] = c
				heap.Push(&p.mu.due, c)
			}
			p.mu.Unlock()
			return
		}
		mb := p.b.store.NewMetaBatch()
		deleteCK(mb, c)
		if err := mb.Commit(p.syncMeta()); err != nil {
			p.b.log.Warn("broker: pop checkpoint not deleted; its messages may be revived again", "err", err)
		}
	}
}

func (p *popService) revive(ctx context.Context, c *popCK) error {
	retry := c.id.topic
	if !isRetryTopicName(retry) {
		retry = protocol.PopRetryTopicV1(c.id.topic, c.id.group)
		p.noteRetryTopic(retry, c.id.topic, c.id.group)
	}
	for i, off := range c.offsets {
		if c.acked&(1<<i) != 0 {
			continue
		}
		var orig protocol.MessageExt
		found := false
		_, err := p.b.store.Get(c.id.topic, c.id.queue, off, 1, 0, func(rec []byte, _ int64) bool {
			m, _, err := protocol.DecodeRecord(rec)
			if err == nil && m.QueueOffset == off {
				orig, found = m.Clone(), true
			}
			return true
		})
		if err != nil {
			return err
		}
		if !found {
			continue // gone (retention): nothing to revive
		}
		if _, err := p.b.ensureTopic(ctx, retry, popRetryQueues, protocol.PermRead|protocol.PermWrite); err != nil {
			return err
		}
		m := &InboundMessage{
			Topic:             retry,
			QueueID:           0,
			Flag:              orig.Flag,
			Body:              orig.Body,
			Properties:        orig.Properties,
			SysFlag:           orig.SysFlag,
			BornTimestamp:     orig.BornTimestamp,
			BornHost:          p.b.storeHost(),
			ReconsumeTimes:    orig.ReconsumeTimes + 1,
			MaxReconsumeTimes: -1,
		}
		if v, ok := orig.Property(protocol.PropFirstPopTime); orig.ReconsumeTimes == 0 || !ok || v == "" {
			m.SetProperty(protocol.PropFirstPopTime, strconv.FormatInt(c.id.popTime, 10))
		}
		if _, err := p.b.storeInternal(ctx, m); err != nil {
			return err
		}
	}
	return nil
}

// ckHeap orders checkpoints by revive time (container/heap).
type ckHeap []*popCK

func (h ckHeap) Len() int           { return len(h) }
func (h ckHeap) Less(i, j int) bool { return h[i].reviveAt() < h[j].reviveAt() }
func (h ckHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}

func (h *ckHeap) Push(x any) {
	c := x.(*popCK)
	c.index = len(*h)
	*h = append(*h, c)
}

func (h *ckHeap) Pop() any {
	old := *h
	n := len(old)
	c := old[n-1]
	old[n-1] = nil
	c.index = -1
	*h = old[:n-1]
	return c
}
