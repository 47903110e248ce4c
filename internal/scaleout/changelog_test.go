package scaleout

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil"
)

// TestSegmentReaderPullsAhead reads, with pulls in flight at successive
// offsets, a segment of many chunks whose messages are interleaved with
// another writer's chunks (a fenced owner's) and a duplicate of one of its
// own (a retried send): the data comes back whole and in order. A range
// cut short of the segment's last chunk fails with ErrSegmentGone, and a
// reader closed midway joins its pulls and fails its later reads.
func TestSegmentReaderPullsAhead(t *testing.T) {
	r := newRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := r.cl.NewClient(t)
	p := testutil.NewProducer(t, c, "runnel_seg_reader")
	const chunks = pullDepth + 3
	data := make([]byte, chunks*ChunkSize-1234)
	for i := range data {
		data[i] = byte(i*31 + i>>20)
	}
	mine := newSegmentWriter(ctx, p, r.log.Changelog, r.log.ChangelogTopic, r.log.Task, 9, 111)
	other := newSegmentWriter(ctx, p, r.log.Changelog, r.log.ChangelogTopic, r.log.Task, 9, 222)
	for i := 0; i*ChunkSize < len(data); i++ {
		part := data[i*ChunkSize : min((i+1)*ChunkSize, len(data))]
		last := (i+1)*ChunkSize >= len(data)
		other.buf = append(other.buf[:0], "stale"...)
		other.send(false)
		if i == 5 { // a duplicate of chunk 4 (the index stays at 5)
			mine.hdr.index--
			mine.buf = append(mine.buf[:0], data[4*ChunkSize:5*ChunkSize]...)
			mine.send(false)
		}
		mine.buf = append(mine.buf[:0], part...)
		if last {
			break
		}
		mine.send(false)
	}
	seg, err := mine.finish()
	if err != nil {
		t.Fatal(err)
	}
	got, err := ReadSegment(ctx, c, r.group, r.log.Changelog, r.log.Task, seg)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes, want %d (equal: %v)", len(got), len(data), bytes.Equal(got[:min(len(got), len(data))], data[:min(len(got), len(data))]))
	}

	short := seg
	short.To--
	if _, err := ReadSegment(ctx, c, r.group, r.log.Changelog, r.log.Task, short); !errors.Is(err, ErrSegmentGone) {
		t.Fatalf("range short of the last chunk: %v, want ErrSegmentGone", err)
	}

	sr := NewSegmentReader(ctx, c, r.group, r.log.Changelog, r.log.Task, seg)
	if _, err := io.ReadFull(sr, make([]byte, 3*ChunkSize)); err != nil {
		t.Fatal(err)
	}
	if err := sr.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(sr); err == nil {
		t.Fatal("a closed reader read to the end")
	}
}
