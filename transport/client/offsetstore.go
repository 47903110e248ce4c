package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// offsetStore keeps a PushConsumer's consume offsets: the offset of the
// next message to consume per queue (the smallest still in process), as
// RocketMQ's RemoteBrokerOffsetStore (clustering: the broker keeps them)
// and LocalFileOffsetStore (broadcasting: a file of this consumer's)
// do. Safe for concurrent use.
type offsetStore interface {
	// read returns the stored offset of q (false when there is none).
	read(ctx context.Context, q protocol.MessageQueue) (int64, bool, error)
	// update sets the local offset of q; with increaseOnly only a larger
	// offset replaces it.
	update(q protocol.MessageQueue, off int64, increaseOnly bool)
	// get returns the local offset of q.
	get(q protocol.MessageQueue) (int64, bool)
	// persist stores the local offsets of qs that changed since they were
	// last stored.
	persist(ctx context.Context, qs []protocol.MessageQueue) error
	// remove forgets q's local offset.
	remove(q protocol.MessageQueue)
}

type offsetEntry struct {
	off       int64
	persisted int64 // -1: never
}

type offsetTable struct {
	mu sync.Mutex
	m  map[protocol.MessageQueue]*offsetEntry
}

func (t *offsetTable) update(q protocol.MessageQueue, off int64, increaseOnly bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = make(map[protocol.MessageQueue]*offsetEntry)
	}
	e, ok := t.m[q]
	if !ok {
		t.m[q] = &offsetEntry{off: off, persisted: -1}
		return
	}
	if !increaseOnly || off > e.off {
		e.off = off
	}
}

func (t *offsetTable) get(q protocol.MessageQueue) (int64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.m[q]; ok {
		return e.off, true
	}
	return 0, false
}

func (t *offsetTable) remove(q protocol.MessageQueue) {
	t.mu.Lock()
	delete(t.m, q)
	t.mu.Unlock()
}

// remoteOffsets stores offsets on the brokers (UPDATE_CONSUMER_OFFSET).
type remoteOffsets struct {
	offsetTable
	c     *Client
	group string
}

func (r *remoteOffsets) read(ctx context.Context, q protocol.MessageQueue) (int64, bool, error) {
	off, err := r.c.QueryConsumerOffset(ctx, r.group, q)
	switch {
	case errors.Is(err, ErrNoOffset):
		return 0, false, nil
	case err != nil:
		return 0, false, err
	}
	return off, off >= 0, nil
}

func (r *remoteOffsets) persist(ctx context.Context, qs []protocol.MessageQueue) error {
	var errs []error
	for _, q := range qs {
		r.mu.Lock()
		e, ok := r.m[q]
		var off int64
		if ok && e.off != e.persisted {
			off = e.off
		} else {
			ok = false
		}
		r.mu.Unlock()
		if !ok {
			continue
		}
		if err := r.c.CommitOffset(ctx, r.group, q, off); err != nil {
			errs = append(errs, err)
			continue
		}
		r.mu.Lock()
		if e, ok := r.m[q]; ok {
			e.persisted = off
		}
		r.mu.Unlock()
	}
	return errors.Join(errs...)
}

// fileOffsets stores offsets in a JSON file of this consumer (broadcasting:
// every member consumes every queue and keeps its own progress). The file
// is replaced atomically (written aside, synced, renamed, directory synced).
type fileOffsets struct {
	offsetTable
	path string
	wmu  sync.Mutex // serialises file writes
}

// offsetFile is the file's format.
type offsetFile struct {
	OffsetTable []offsetFileEntry `json:"offsetTable"`
}

type offsetFileEntry struct {
	Topic      string `json:"topic"`
	BrokerName string `json:"brokerName"`
	QueueID    int32  `json:"queueId"`
	Offset     int64  `json:"offset"`
}

// maxOffsetFile bounds the offset file read at start.
const maxOffsetFile = 64 << 20

func openFileOffsets(path string) (*fileOffsets, error) {
	f := &fileOffsets{path: path}
	f.m = make(map[protocol.MessageQueue]*offsetEntry)
	st, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return f, nil
	}
	if err != nil {
		return nil, fmt.Errorf("client: offset file: %w", err)
	}
	if st.Size() > maxOffsetFile {
		return nil, fmt.Errorf("client: offset file %s is larger than %d bytes", path, maxOffsetFile)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("client: offset file: %w", err)
	}
	var of offsetFile
	if err := json.Unmarshal(b, &of); err != nil {
		return nil, fmt.Errorf("client: offset file %s: %w", path, err)
	}
	for _, e := range of.OffsetTable {
		q := protocol.MessageQueue{Topic: e.Topic, BrokerName: e.BrokerName, QueueID: e.QueueID}
		f.m[q] = &offsetEntry{off: e.Offset, persisted: e.Offset}
	}
	return f, nil
}

func (f *fileOffsets) read(_ context.Context, q protocol.MessageQueue) (int64, bool, error) {
	off, ok := f.get(q)
	return off, ok, nil
}

// persist writes every known offset (the file holds them all) when one of
// qs changed.
func (f *fileOffsets) persist(_ context.Context, qs []protocol.MessageQueue) error {
	f.wmu.Lock()
	defer f.wmu.Unlock()
	f.mu.Lock()
	changed := false
	for _, q := range qs {
		if e, ok := f.m[q]; ok && e.off != e.persisted {
			changed = true
		}
	}
	if !changed {
		f.mu.Unlock()
		return nil
	}
	var of offsetFile
	snap := make(map[protocol.MessageQueue]int64, len(f.m))
	for q, e := range f.m {
		of.OffsetTable = append(of.OffsetTable, offsetFileEntry{Topic: q.Topic, BrokerName: q.BrokerName, QueueID: q.QueueID, Offset: e.off})
		snap[q] = e.off
	}
	f.mu.Unlock()
	slices.SortFunc(of.OffsetTable, func(a, b offsetFileEntry) int {
		return protocol.MessageQueue{Topic: a.Topic, BrokerName: a.BrokerName, QueueID: a.QueueID}.Compare(
			protocol.MessageQueue{Topic: b.Topic, BrokerName: b.BrokerName, QueueID: b.QueueID})
	})
	b, err := json.MarshalIndent(&of, "", "  ") // once per persist interval, not per message
	if err != nil {
		return err
	}
	if err := writeFileAtomic(f.path, b); err != nil {
		return fmt.Errorf("client: offset file: %w", err)
	}
	f.mu.Lock()
	for q, off := range snap {
		if e, ok := f.m[q]; ok {
			e.persisted = off
		}
	}
	f.mu.Unlock()
	return nil
}

// remove keeps the offset in the file (a queue revoked in broadcasting
// mode comes back with it); it only stops tracking changes.
func (f *fileOffsets) remove(protocol.MessageQueue) {}

// writeFileAtomic replaces path with b: a temporary file beside it is
// written and synced, renamed over path, and the directory synced.
func writeFileAtomic(path string, b []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	name := tmp.Name()
	_, err = tmp.Write(b)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(name, path)
	}
	if err != nil {
		_ = os.Remove(name)
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	return errors.Join(err, d.Close())
}
