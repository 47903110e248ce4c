package scaleout

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
)

// TestReadAhead: the bytes come through whole and in order, a reader's
// error after its data reaches the consumer after that data, and Close
// joins a goroutine blocked on a full buffer.
func TestReadAhead(t *testing.T) {
	data := make([]byte, 3*ChunkSize+12345)
	for i := range data {
		data[i] = byte(i * 7)
	}
	ra := newReadAhead(context.Background(), func(context.Context) io.Reader { return bytes.NewReader(data) })
	got, err := io.ReadAll(ra)
	ra.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes (err %v), want %d", len(got), err, len(data))
	}

	boom := errors.New("boom")
	ra = newReadAhead(context.Background(), func(context.Context) io.Reader {
		return io.MultiReader(bytes.NewReader(data[:ChunkSize+1]), &errReader{boom})
	})
	got, err = io.ReadAll(ra)
	ra.Close()
	if !errors.Is(err, boom) || len(got) != ChunkSize+1 {
		t.Fatalf("read %d bytes, err %v: want %d then boom", len(got), err, ChunkSize+1)
	}

	big := make([]byte, (readAheadDepth+4)*ChunkSize)
	ra = newReadAhead(context.Background(), func(context.Context) io.Reader { return bytes.NewReader(big) })
	if _, err := ra.Read(make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	ra.Close() // the goroutine is blocked sending: Close must not hang
}

type errReader struct{ err error }

func (e *errReader) Read([]byte) (int, error) { return 0, e.err }
