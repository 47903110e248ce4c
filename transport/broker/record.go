package broker

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"

	"github.com/runnel-dev/runnel/transport/broker/internal/store"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// maxPooledBuf bounds the buffers kept in the pool; bigger ones (a pull of
// one huge message, a large batch) are left to the GC.
const maxPooledBuf = 1 << 20

func (b *Broker) getBuf() *[]byte { return b.bufs.Get().(*[]byte) }

func (b *Broker) putBuf(bp *[]byte) {
	if cap(*bp) > maxPooledBuf {
		return
	}
	*bp = (*bp)[:0]
	b.bufs.Put(bp)
}

// peerAddr returns a connection peer's address as netip (the born host).
func peerAddr(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}

// tagsCode is the consume-queue tags code of a properties string: Java's
// String.hashCode of TAGS, 0 without a tag (protocol §4.8).
func tagsCode(props string) int64 {
	if t, ok := protocol.PropertyValue(props, protocol.PropTags); ok && t != "" {
		return protocol.TagsHashCode(t)
	}
	return 0
}

// appendIndexKeys appends the QUERY_MESSAGE index keys of a message: each
// space-separated KEYS value and the UNIQ_KEY. Keys the store would refuse
// (too long) are skipped; the count is capped.
func appendIndexKeys(dst []string, props string) []string {
	base := len(dst) // dst may hold earlier messages' keys (a batch)
	add := func(k string) {
		if k != "" && len(k) <= store.MaxNameLen && len(dst)-base < store.MaxKeysPerMessage {
			dst = append(dst, k)
		}
	}
	if keys, ok := protocol.PropertyValue(props, protocol.PropKeys); ok {
		for keys != "" {
			k := keys
			if i := strings.IndexByte(keys, ' '); i >= 0 {
				k, keys = keys[:i], keys[i+1:]
			} else {
				keys = ""
			}
			add(k)
		}
	}
	if u, ok := protocol.PropertyValue(props, protocol.PropUniqKey); ok {
		add(u)
	}
	return dst
}

// encodeRecord appends m as a stored record (offsets and store time are
// patched by the store) and returns the buffer and the record's
// STORETIMESTAMP position.
func (b *Broker) encodeRecord(dst []byte, m *InboundMessage) ([]byte, int, error) {
	ext := protocol.MessageExt{
		QueueID:                   m.QueueID,
		Flag:                      m.Flag,
		SysFlag:                   m.SysFlag,
		BornTimestamp:             m.BornTimestamp,
		BornHost:                  m.BornHost,
		StoreHost:                 b.host,
		ReconsumeTimes:            m.ReconsumeTimes,
		PreparedTransactionOffset: m.PreparedTransactionOffset,
		Body:                      m.Body,
		Topic:                     m.Topic,
		Properties:                m.Properties,
	}
	start := len(dst)
	out, err := ext.AppendRecord(dst)
	if err != nil {
		return dst, 0, &protocol.Error{Code: protocol.ResMessageIllegal, Remark: err.Error()}
	}
	sysFlag := int32(binary.BigEndian.Uint32(out[start+protocol.RecordSysFlagPos:]))
	return out, protocol.RecordStoreTimestampPos(sysFlag), nil
}

// storeOne encodes and stores one message; the store wakes long-poll
// waiters through its Notify hook.
func (b *Broker) storeOne(ctx context.Context, m *InboundMessage) (StoredResult, error) {
	bp := b.getBuf()
	defer b.putBuf(bp)
	rec, tsPos, err := b.encodeRecord((*bp)[:0], m)
	if err != nil {
		return StoredResult{}, err
	}
	*bp = rec
	var keyArr [4]string
	msgs := []store.PutMessage{{
		Topic:             m.Topic,
		QueueID:           m.QueueID,
		Record:            rec,
		StoreTimestampPos: tsPos,
		TagsCode:          tagsCode(m.Properties),
		Keys:              appendIndexKeys(keyArr[:0], m.Properties),
	}}
	res, err := b.store.Put(ctx, msgs)
	if err != nil {
		return StoredResult{}, storeError(err)
	}
	r := res[0]
	return StoredResult{
		QueueOffset:    r.QueueOffset,
		PhysicalOffset: r.PhysicalOffset,
		StoreTimestamp: r.StoreTimestamp,
		MsgID:          protocol.OffsetMsgID(b.host, r.PhysicalOffset),
	}, nil
}

// storeError maps a store failure to the response a client should see.
func storeError(err error) error {
	switch {
	case errors.Is(err, store.ErrInvalid):
		return &protocol.Error{Code: protocol.ResMessageIllegal, Remark: err.Error()}
	case errors.Is(err, store.ErrDiskFull):
		return &protocol.Error{Code: protocol.ResServiceNotAvailable,
			Remark: "[DISK_FULL] service not available now, the broker's disk is full: " + err.Error() +
				"; writes resume once space is freed"}
	case errors.Is(err, store.ErrFailed):
		// The cause names files of the data dir: only its errno goes out.
		reason := "an I/O error"
		var errno syscall.Errno
		if errors.As(err, &errno) {
			reason = errno.Error()
		}
		return &protocol.Error{Code: protocol.ResServiceNotAvailable,
			Remark: "[STORE_FAILED] service not available now, the message store failed a write (" + reason +
				") and refuses writes until the broker restarts; see the broker's log"}
	case errors.Is(err, store.ErrClosed):
		return &protocol.Error{Code: protocol.ResServiceNotAvailable, Remark: err.Error()}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return &protocol.Error{Code: protocol.ResSystemBusy, Remark: "[REJECTREQUEST]system busy: " + err.Error()}
	}
	return &protocol.Error{Code: protocol.ResSystemError, Remark: fmt.Sprintf("store: %v", err)}
}

// batchItem is one decoded item of a batch body.
type batchItem struct {
	flag  int32
	body  []byte
	props string
}

// storeBatch encodes every item of a batch into one buffer and stores them
// with one atomic Put (consecutive offsets in one queue). tmpl carries the
// fields shared by all items (topic, queue, sysFlag, born info). end is
// the log end after the batch's last record.
func (b *Broker) storeBatch(ctx context.Context, tmpl *InboundMessage, items []batchItem) (_ []store.PutResult, end int64, _ error) {
	bp := b.getBuf()
	defer b.putBuf(bp)
	buf := (*bp)[:0]
	ends := make([]int, len(items))
	tsPos := make([]int, len(items))
	m := *tmpl
	for i, it := range items {
		m.Flag, m.Body, m.Properties = it.flag, it.body, it.props
		var err error
		buf, tsPos[i], err = b.encodeRecord(buf, &m)
		if err != nil {
			return nil, 0, err
		}
		ends[i] = len(buf)
	}
	*bp = buf
	msgs := make([]store.PutMessage, len(items))
	keys := make([]string, 0, len(items))
	start := 0
	for i, it := range items {
		k0 := len(keys)
		keys = appendIndexKeys(keys, it.props)
		msgs[i] = store.PutMessage{
			Topic:             tmpl.Topic,
			QueueID:           tmpl.QueueID,
			Record:            buf[start:ends[i]:ends[i]],
			StoreTimestampPos: tsPos[i],
			TagsCode:          tagsCode(it.props),
			Keys:              keys[k0:len(keys):len(keys)],
		}
		start = ends[i]
	}
	res, err := b.store.Put(ctx, msgs)
	if err != nil {
		return nil, 0, storeError(err)
	}
	last := len(res) - 1
	return res, res[last].PhysicalOffset + int64(len(msgs[last].Record)), nil
}

// storeAll encodes msgs and stores them with one atomic store Put: all or
// none, sharing one fsync. Transactions use it to write a final message and
// its op record together. Like storeInternal it validates nothing and
// creates no topic. end is the log end after the last record.
func (b *Broker) storeAll(ctx context.Context, msgs ...*InboundMessage) (_ []StoredResult, end int64, _ error) {
	if !b.running() {
		return nil, 0, fmt.Errorf("broker: store: %w", ErrClosed)
	}
	bp := b.getBuf()
	defer b.putBuf(bp)
	buf := (*bp)[:0]
	ends := make([]int, len(msgs))
	tsPos := make([]int, len(msgs))
	for i, m := range msgs {
		if m.QueueID < 0 {
			return nil, 0, fmt.Errorf("broker: store %s: negative queue id %d", m.Topic, m.QueueID)
		}
		var err error
		if buf, tsPos[i], err = b.encodeRecord(buf, m); err != nil {
			return nil, 0, err
		}
		ends[i] = len(buf)
	}
	*bp = buf
	puts := make([]store.PutMessage, len(msgs))
	start := 0
	for i, m := range msgs {
		puts[i] = store.PutMessage{
			Topic:             m.Topic,
			QueueID:           m.QueueID,
			Record:            buf[start:ends[i]:ends[i]],
			StoreTimestampPos: tsPos[i],
			TagsCode:          tagsCode(m.Properties),
			Keys:              appendIndexKeys(nil, m.Properties),
		}
		start = ends[i]
	}
	res, err := b.store.Put(ctx, puts)
	if err != nil {
		return nil, 0, storeError(err)
	}
	end = res[len(res)-1].PhysicalOffset + int64(len(puts[len(puts)-1].Record))
	out := make([]StoredResult, len(res))
	for i, r := range res {
		out[i] = StoredResult{
			QueueOffset:    r.QueueOffset,
			PhysicalOffset: r.PhysicalOffset,
			StoreTimestamp: r.StoreTimestamp,
			MsgID:          protocol.OffsetMsgID(b.host, r.PhysicalOffset),
		}
	}
	return out, end, nil
}
