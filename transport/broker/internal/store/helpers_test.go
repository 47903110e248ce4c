package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		os.Exit(runCrashChild(dir))
	}
	goleak.VerifyTestMain(m)
}

// makeRecord builds a §4.1 record with placeholder offsets/timestamp.
// bornV6 makes the born host 20 bytes (STORETIMESTAMP at 68).
func makeRecord(topic string, queue int32, body []byte, bornV6 bool) ([]byte, int) {
	born := 8
	if bornV6 {
		born = 20
	}
	n := 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + born + 8 + 8 + 4 + 8 + 4 + len(body) + 1 + len(topic) + 2
	r := make([]byte, 0, n)
	r = binary.BigEndian.AppendUint32(r, uint32(n))
	r = binary.BigEndian.AppendUint32(r, 0xDAA320A7)
	r = binary.BigEndian.AppendUint32(r, 0) // body crc
	r = binary.BigEndian.AppendUint32(r, uint32(queue))
	r = binary.BigEndian.AppendUint32(r, 0) // flag
	r = binary.BigEndian.AppendUint64(r, ^uint64(0))
	r = binary.BigEndian.AppendUint64(r, ^uint64(0))
	r = binary.BigEndian.AppendUint32(r, 0)   // sysflag
	r = binary.BigEndian.AppendUint64(r, 123) // born ts
	r = append(r, make([]byte, born)...)
	tsPos := len(r)
	r = binary.BigEndian.AppendUint64(r, ^uint64(0)) // store ts
	r = append(r, 10, 0, 0, 5, 0, 0, 0x2a, 0x9f)     // store host
	r = binary.BigEndian.AppendUint32(r, 0)
	r = binary.BigEndian.AppendUint64(r, 0)
	r = binary.BigEndian.AppendUint32(r, uint32(len(body)))
	r = append(r, body...)
	r = append(r, byte(len(topic)))
	r = append(r, topic...)
	r = binary.BigEndian.AppendUint16(r, 0)
	return r, tsPos
}

// recordBody extracts the body of an IPv4 record built by makeRecord.
func recordBody(rec []byte) []byte {
	n := binary.BigEndian.Uint32(rec[84:])
	return rec[88 : 88+n]
}

func recQueueOffset(rec []byte) int64 { return int64(binary.BigEndian.Uint64(rec[posQueueOffset:])) }
func recStoreTS(rec []byte, pos int) int64 {
	return int64(binary.BigEndian.Uint64(rec[pos:]))
}

func msg(topic string, queue int32, body string, keys ...string) PutMessage {
	rec, pos := makeRecord(topic, queue, []byte(body), false)
	return PutMessage{Topic: topic, QueueID: queue, Record: rec, StoreTimestampPos: pos, Keys: keys}
}

// testClock is a settable clock.
type testClock struct{ ms atomic.Int64 }

func (c *testClock) now() time.Time { return time.UnixMilli(c.ms.Load()) }

func openTest(t testing.TB, dir string, opts Options) *Store {
	t.Helper()
	s, err := Open(dir, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

func mustPut(t testing.TB, s *Store, msgs ...PutMessage) []PutResult {
	t.Helper()
	res, err := s.Put(context.Background(), msgs)
	if err != nil {
		t.Fatalf("Put: %v", err)
	}
	if len(res) != len(msgs) {
		t.Fatalf("Put returned %d results for %d messages", len(res), len(msgs))
	}
	return res
}

// getAll returns copies of all records of a queue from offset.
func getAll(t testing.TB, s *Store, topic string, queue int32, from int64) [][]byte {
	t.Helper()
	var out [][]byte
	for {
		n := 0
		next, err := s.Get(topic, queue, from, 64, 0, func(rec []byte, _ int64) bool {
			out = append(out, bytes.Clone(rec))
			n++
			return true
		})
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		if n == 0 {
			return out
		}
		from = next
	}
}

// checkFor polls fn until it returns nil or the deadline passes.
func checkFor(t testing.TB, total time.Duration, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met after %v: %v", total, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func mustOffset(t testing.TB, f func(string, int32) (int64, error), topic string, q int32) int64 {
	t.Helper()
	v, err := f(topic, q)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }
