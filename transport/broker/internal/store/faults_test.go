package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// walFault fails the n-th WAL operation of its kind (fsync, or write)
// after it is armed, and every such operation after that one (a disk that
// went bad), counting them.
type walFault struct {
	write     bool         // fail writes instead of fsyncs
	countdown atomic.Int64 // > 0 when armed
	failed    atomic.Bool
	after     atomic.Int64 // operations attempted after the failure
}

func (f *walFault) MaybeError(op errorfs.Op) error {
	if !strings.HasSuffix(op.Path, ".log") {
		return nil
	}
	switch op.Kind {
	case errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo:
		if f.write {
			return nil
		}
	case errorfs.OpFileWrite, errorfs.OpFileWriteAt:
		if !f.write {
			return nil
		}
	default:
		return nil
	}
	if f.failed.Load() {
		f.after.Add(1)
		return errorfs.ErrInjected
	}
	if f.countdown.Load() > 0 && f.countdown.Add(-1) == 0 {
		f.failed.Store(true)
		return errorfs.ErrInjected
	}
	return nil
}

func (f *walFault) String() string { return "walFault" }

// faultFS injects f's faults into the writes and fsyncs of the files it
// creates, opens or reuses. (errorfs.Wrap does the same, except for a file
// Pebble reuses: a recycled WAL would escape the fault.)
type faultFS struct {
	vfs.FS
	f *walFault
}

func (fs faultFS) wrap(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil {
		return f, err
	}
	return faultFile{File: f, path: name, f: fs.f}, nil
}

func (fs faultFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, c)
	return fs.wrap(name, f, err)
}

func (fs faultFS) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(oldname, newname, c)
	return fs.wrap(newname, f, err)
}

func (fs faultFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.OpenReadWrite(name, c, opts...)
	return fs.wrap(name, f, err)
}

type faultFile struct {
	vfs.File
	path string
	f    *walFault
}

func (f faultFile) fault(k errorfs.OpKind) error {
	return f.f.MaybeError(errorfs.Op{Kind: k, Path: f.path})
}

func (f faultFile) Write(p []byte) (int, error) {
	if err := f.fault(errorfs.OpFileWrite); err != nil {
		return 0, err
	}
	return f.File.Write(p)
}

func (f faultFile) WriteAt(p []byte, off int64) (int, error) {
	if err := f.fault(errorfs.OpFileWriteAt); err != nil {
		return 0, err
	}
	return f.File.WriteAt(p, off)
}

func (f faultFile) Sync() error {
	if err := f.fault(errorfs.OpFileSync); err != nil {
		return err
	}
	return f.File.Sync()
}

func (f faultFile) SyncData() error {
	if err := f.fault(errorfs.OpFileSyncData); err != nil {
		return err
	}
	return f.File.SyncData()
}

func (f faultFile) SyncTo(length int64) (bool, error) {
	if err := f.fault(errorfs.OpFileSyncTo); err != nil {
		return false, err
	}
	return f.File.SyncTo(length)
}

// TestFailedWALIsFailStop's producers slow down once they wrote
// slowAfterBytes of bodies before the fault fired, and give up at
// stopAfterBytes: the store writes less than twice the bodies' bytes, and
// the memtable the test prepares holds 8 MiB.
const (
	slowAfterBytes = 1 << 20
	stopAfterBytes = 3 << 20
)

// growMemtable writes to topic "W" and flushes until s's Pebble has an
// empty memtable of at least size bytes.
func growMemtable(t *testing.T, s *Store, size uint64) {
	t.Helper()
	body := strings.Repeat("m", 4<<10)
	for i := 0; ; i++ {
		m := s.db.Metrics().MemTable
		if m.Size >= size {
			return
		}
		if i > 10 {
			t.Fatalf("memtable still %d bytes after %d flushes", m.Size, i)
		}
		batch := make([]PutMessage, 0, 64)
		for written := uint64(0); written < m.Size/2+(64<<10); written += uint64(len(body)) {
			batch = append(batch, msg("W", 0, body))
			if len(batch) == cap(batch) {
				mustPut(t, s, batch...)
				batch = batch[:0]
			}
		}
		if len(batch) > 0 {
			mustPut(t, s, batch...)
		}
		if err := s.db.Flush(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFailedWALIsFailStop fails the n-th WAL fsync or WAL write under
// concurrent producers, in both flush modes: every Put that was not
// acknowledged gets ErrFailed, within a second, later writes (messages,
// offsets, meta) are refused at once without touching the WAL again, reads
// keep working, the process goes on, and after a reopen every acknowledged
// message is there with its body at its offset (in ASYNC mode a tail of
// each queue, acknowledged since the last fsync, may be missing: Pebble's
// WAL writer never wrote it).
//
// In ASYNC mode nobody waits for the WAL writer: the failure surfaces in its
// background flush, and without the store's guard (walWatchFS, commitBatch)
// the next commit's WAL append panics inside Pebble and ends the process.
// The WAL-write cases have no fsync in the way (SyncInterval of an hour),
// so that only the guard stands between the failure and that panic.
func TestFailedWALIsFailStop(t *testing.T) {
	for _, tc := range []struct {
		name     string
		mode     FlushMode
		write    bool
		interval time.Duration
	}{
		{"sync/fsync", FlushSync, false, 0},
		{"sync/write", FlushSync, true, 0},
		{"async/fsync", FlushAsync, false, 5 * time.Millisecond},
		{"async/write", FlushAsync, true, time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			fault := &walFault{write: tc.write}
			s := openTest(t, dir, Options{
				FlushMode:     tc.mode,
				SyncInterval:  tc.interval,
				PebbleOptions: &pebble.Options{FS: faultFS{FS: vfs.Default, f: fault}},
			})
			mustPut(t, s, msg("T", 0, "before"))
			// A rotation closes (and syncs) the WAL, and a failure there
			// panics inside Pebble (the documented limit in FlushAsync's
			// notes), which no store can turn into an error: the memtable
			// must hold everything written after the fault is armed.
			// Pebble starts with a 256 KiB memtable and doubles the next
			// one at each rotation, unless a forced flush finds it less
			// than half full; so memtables are filled past half and
			// flushed until an empty one holds 8 MiB.
			growMemtable(t, s, 8<<20)
			fault.countdown.Store(7)

			type acked struct {
				queue int32
				off   int64
				body  string
			}
			var mu sync.Mutex
			var ack []acked
			var wg sync.WaitGroup
			var slow, written atomic.Int64
			errs := make(chan error, 4)
			for w := range 4 {
				wg.Go(func() {
					// Bodies of 1 KiB fill the WAL writer's 32 KiB blocks,
					// whose flushes are the WAL writes.
					pad := strings.Repeat("x", 1024)
					for i := 0; ; i++ {
						// The fault must fire before the memtable fills (a
						// rotation then would panic, see above). In ASYNC mode
						// the failing fsync comes from the store's syncer on
						// its own clock, which a loaded machine delays while
						// producers go on writing (the full suite saw the
						// panic): past slowAfterBytes they write slowly.
						if n := written.Load(); n > slowAfterBytes && !fault.failed.Load() {
							if n > stopAfterBytes {
								errs <- fmt.Errorf("the fault did not fire before %d bytes were written", n)
								return
							}
							time.Sleep(2 * time.Millisecond) // the syncer fsyncs only after writes
						}
						body := fmt.Sprintf("w%d-%d-%s", w, i, pad)
						start := time.Now()
						res, err := s.Put(context.Background(), []PutMessage{msg("T", int32(w), body)})
						if d := time.Since(start); d > time.Second {
							slow.Store(int64(d))
						}
						if err != nil {
							errs <- err
							return
						}
						written.Add(int64(len(body)))
						mu.Lock()
						ack = append(ack, acked{int32(w), res[0].QueueOffset, body})
						mu.Unlock()
						if i > 100000 {
							errs <- errors.New("no failure after 100000 puts")
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if !errors.Is(err, ErrFailed) {
					t.Fatalf("producer error %v, want ErrFailed", err)
				}
				if !strings.Contains(err.Error(), "injected") {
					t.Errorf("error %q does not name the cause", err)
				}
			}
			if d := time.Duration(slow.Load()); d > 0 {
				t.Errorf("a Put returned after %v", d)
			}
			if !fault.failed.Load() {
				t.Fatal("the fault never fired")
			}
			t.Logf("%d puts acknowledged before the failure", len(ack))

			// Fail-stop: refused at once, the WAL never touched again.
			start := time.Now()
			if _, err := s.Put(context.Background(), []PutMessage{msg("T", 0, "late")}); !errors.Is(err, ErrFailed) {
				t.Fatalf("Put after failure: %v", err)
			}
			if err := s.CommitOffset("G", "T", 0, 1); !errors.Is(err, ErrFailed) {
				t.Fatalf("CommitOffset after failure: %v", err)
			}
			if err := s.PutMeta([]byte("k"), []byte("v")); !errors.Is(err, ErrFailed) {
				t.Fatalf("PutMeta after failure: %v", err)
			}
			if err := s.TruncateBefore("T", 0, 1); !errors.Is(err, ErrFailed) {
				t.Fatalf("TruncateBefore after failure: %v", err)
			}
			if d := time.Since(start); d > time.Second {
				t.Fatalf("refusals took %v", d)
			}
			if err := s.Failed(); !errors.Is(err, ErrFailed) {
				t.Fatalf("Failed() = %v", err)
			}
			if got := getAll(t, s, "T", 0, 0); len(got) == 0 || string(recordBody(got[0])) != "before" {
				t.Fatalf("reads after failure: %d records", len(got))
			}
			if err := s.Close(); err != nil {
				t.Logf("Close after failure: %v", err)
			}
			if n := fault.after.Load(); n != 0 {
				t.Fatalf("%d WAL operations of the failed kind after the failure", n)
			}

			s = openTest(t, dir, Options{})
			defer s.Close()
			bodies := map[int32][][]byte{}
			for q := range int32(4) {
				bodies[q] = getAll(t, s, "T", q, 0)
			}
			// In ASYNC mode a failed WAL write or fsync may lose what was
			// acknowledged since the last fsync: Pebble's WAL writer keeps
			// its current block in memory until a flush, and after the
			// failure it writes nothing more. Only a tail of each queue may
			// be missing: what is back must be what was acknowledged at its
			// offset.
			lossy := tc.mode == FlushAsync
			for _, a := range ack {
				recs := bodies[a.queue]
				if lossy && a.off >= int64(len(recs)) {
					continue
				}
				if a.off >= int64(len(recs)) {
					t.Fatalf("acknowledged %.8s at %d/%d lost: queue has %d", a.body, a.queue, a.off, len(recs))
				}
				if got := recordBody(recs[a.off]); !bytes.Equal(got, []byte(a.body)) {
					t.Fatalf("acknowledged %.8s at %d/%d reads back %.8q", a.body, a.queue, a.off, got)
				}
			}
			mustPut(t, s, msg("T", 0, "after restart"))
		})
	}
}

// TestDiskHighWatermark drives the watermark with a fake usage reading:
// Puts are refused with ErrDiskFull above it (also when a burst would
// cross it between two readings) and accepted again once usage falls.
func TestDiskHighWatermark(t *testing.T) {
	var avail atomic.Uint64
	const total = 100 << 20
	avail.Store(50 << 20)
	s := openTest(t, t.TempDir(), Options{
		DiskHighWatermark: 0.9,
		DiskCheckInterval: 10 * time.Millisecond,
		DiskUsage:         func() (uint64, uint64, error) { return avail.Load(), total, nil },
	})
	defer s.Close()
	mustPut(t, s, msg("T", 0, "a"))

	avail.Store(5 << 20) // 95% used
	checkFor(t, 2*time.Second, func() error {
		_, err := s.Put(context.Background(), []PutMessage{msg("T", 0, "b")})
		if !errors.Is(err, ErrDiskFull) {
			return fmt.Errorf("Put: %v", err)
		}
		if !strings.Contains(err.Error(), "90.0%") {
			t.Fatalf("error %q does not name the mark", err)
		}
		return nil
	})
	if !s.DiskFull() || s.DiskRefused() == 0 {
		t.Fatalf("DiskFull %v, refused %d", s.DiskFull(), s.DiskRefused())
	}
	if err := s.PutAsync(context.Background(), []PutMessage{msg("T", 0, "c")}, make([]PutResult, 1), func(error) {
		t.Error("done called for a refused PutAsync")
	}); !errors.Is(err, ErrDiskFull) {
		t.Fatalf("PutAsync: %v", err)
	}
	// Offsets are still written (consumers progress on a full disk).
	if err := s.CommitOffset("G", "T", 0, 1); err != nil {
		t.Fatal(err)
	}

	avail.Store(50 << 20)
	checkFor(t, 2*time.Second, func() error {
		_, err := s.Put(context.Background(), []PutMessage{msg("T", 0, "d")})
		return err
	})

	// A burst between two readings: 40 MiB headroom, 4 MiB records.
	avail.Store(50 << 20)
	s2 := openTest(t, t.TempDir(), Options{
		DiskHighWatermark: 0.9,
		DiskCheckInterval: time.Hour,
		MaxRecordBytes:    8 << 20,
		DiskUsage:         func() (uint64, uint64, error) { return avail.Load(), total, nil },
	})
	defer s2.Close()
	big := msg("T", 0, strings.Repeat("x", 4<<20))
	n := 0
	for ; n < 20; n++ {
		rec := bytes.Clone(big.Record)
		_, err := s2.Put(context.Background(), []PutMessage{{Topic: "T", Record: rec, StoreTimestampPos: big.StoreTimestampPos}})
		if errors.Is(err, ErrDiskFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if n != 9 { // 40 MiB of headroom holds 9 records of 4 MiB + overhead
		t.Fatalf("burst: %d puts accepted before the refusal, want 9", n)
	}
}

func TestDiskHighWatermarkOptions(t *testing.T) {
	for _, m := range []float64{-0.1, 1.5} {
		if _, err := Open(t.TempDir(), Options{DiskHighWatermark: m}); !errors.Is(err, ErrInvalid) {
			t.Errorf("mark %v: %v", m, err)
		}
	}
	_, err := Open(t.TempDir(), Options{DiskHighWatermark: 0.5,
		DiskUsage: func() (uint64, uint64, error) { return 0, 0, errors.New("boom") }})
	if err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("Open with failing disk usage: %v", err)
	}
	// The real statfs works on the test's directory.
	s := openTest(t, t.TempDir(), Options{DiskHighWatermark: 0.9999})
	defer s.Close()
	if s.DiskFull() {
		t.Skip("the test file system is more than 99.99% full")
	}
	mustPut(t, s, msg("T", 0, "x"))
}

// BenchmarkDiskAdmit measures the per-Put cost of the high-water mark.
func BenchmarkDiskAdmit(b *testing.B) {
	g := diskGuard{on: true, mark: 0.9}
	g.limit.Store(1 << 62)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := g.admit(1024, 1); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// envRotationChild, set to "<variant> <dir>", makes
// TestWALRotationFailureChild the child process of
// TestWALRotationFailureRecovers.
const envRotationChild = "RUNNEL_STORE_ROTATION_CHILD"

// rotationFaultFS fails the switch to a new WAL file, which Pebble does
// once per memtable: with variant "create" the creation of the WAL file
// numbered from, with "close" the close of that file (Pebble closes a WAL,
// after syncing it, when it rotates to the next one). Earlier WAL files
// work.
type rotationFaultFS struct {
	vfs.FS
	variant string
	from    int
	created atomic.Int64 // WAL files created so far
}

var errRotationFault = errors.New("injected WAL rotation fault")

func (fs *rotationFaultFS) wal(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil || !strings.HasSuffix(fs.PathBase(name), ".log") {
		return f, err
	}
	n := fs.created.Add(1)
	if fs.variant == "create" && n >= int64(fs.from) {
		_ = f.Close()
		return nil, errRotationFault
	}
	if fs.variant == "close" && n >= int64(fs.from) {
		return failCloseFile{f}, nil
	}
	return f, nil
}

func (fs *rotationFaultFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, c)
	return fs.wal(name, f, err)
}

func (fs *rotationFaultFS) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(oldname, newname, c)
	return fs.wal(newname, f, err)
}

// failCloseFile is a WAL file whose Close fails (after closing it).
type failCloseFile struct{ vfs.File }

func (f failCloseFile) Close() error {
	_ = f.File.Close()
	return errRotationFault
}

// TestWALRotationFailureRecovers checks what the store's notes admit: a
// WAL failure while Pebble switches to a new WAL file (once per memtable)
// ends the process (Pebble panics in rotateWAL; the store cannot unwind
// it). A child
// process Puts in SYNC mode with a 1 MiB memtable, printing each
// acknowledged message, until the third WAL file fails to be created or
// closed. The test requires that the child died of it (a panic in
// rotateWAL, not a clean exit nor a store error), then reopens the store on the real
// file system as a restarted broker would: every acknowledged message is
// there with its body at its offset, offsets are dense, and writes work
// again. That is "fail-stop, then recover on restart", with no operator
// step.
func TestWALRotationFailureRecovers(t *testing.T) {
	for _, variant := range []string{"create", "close"} {
		t.Run(variant, func(t *testing.T) {
			dir := t.TempDir()
			cmd := exec.Command(os.Args[0], "-test.run=^TestWALRotationFailureChild$", "-test.count=1")
			cmd.Env = append(os.Environ(), envRotationChild+"="+variant+" "+dir)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err == nil {
				t.Fatalf("child exited cleanly; stderr:\n%s", stderr.String())
			}
			// Pebble panics in rotateWAL; the panic unwinds through
			// Pebble's deferred unlocks of a mutex rotateWAL had released,
			// so the runtime ends the process with "unlock of unlocked
			// mutex" before printing the panic's value.
			if !strings.Contains(stderr.String(), "panic") || !strings.Contains(stderr.String(), "rotateWAL") {
				t.Fatalf("child did not die of the rotation fault (%v); stderr:\n%s", err, stderr.String())
			}
			acked := map[ackKey]uint64{}
			for _, l := range strings.Split(string(out), "\n") {
				if !strings.HasPrefix(l, "ack ") {
					continue
				}
				var k ackKey
				var h uint64
				if _, err := fmt.Sscanf(l, "ack %s %d %d %d", &k.topic, &k.queue, &k.off, &h); err != nil {
					continue // a line cut by the panic
				}
				acked[k] = h
			}
			if len(acked) < 1000 {
				t.Fatalf("child acknowledged %d messages before the fault; stderr:\n%s", len(acked), stderr.String())
			}
			t.Logf("child died of the fault after %d acknowledged messages (%v)", len(acked), err)

			verifyCrashState(t, dir, acked) // every acknowledged message, dense offsets
			s := openTest(t, dir, Options{})
			defer s.Close()
			var maxOff int64
			for k := range acked {
				if k.topic == "rot" && k.queue == 0 {
					maxOff = max(maxOff, k.off+1)
				}
			}
			for q := range int32(2) {
				recs := getAll(t, s, "rot", q, 0)
				for i, r := range recs {
					if recQueueOffset(r) != int64(i) {
						t.Fatalf("rot/%d: offsets not dense at %d", q, i)
					}
				}
				t.Logf("rot/%d: %d records after restart", q, len(recs))
			}
			res := mustPut(t, s, msg("rot", 0, "after restart"))
			if res[0].QueueOffset < maxOff {
				t.Fatalf("offset %d after restart reuses an acknowledged one (< %d)", res[0].QueueOffset, maxOff)
			}
		})
	}
}

// TestWALRotationFailureChild is the child process of
// TestWALRotationFailureRecovers (skipped unless started by it). It never
// returns normally: the rotation fault ends it.
func TestWALRotationFailureChild(t *testing.T) {
	variant, dir, ok := strings.Cut(os.Getenv(envRotationChild), " ")
	if !ok {
		t.Skip("the child process of TestWALRotationFailureRecovers")
	}
	fs := &rotationFaultFS{FS: vfs.Default, variant: variant, from: 3}
	s, err := Open(dir, Options{FlushMode: FlushSync, PebbleOptions: &pebble.Options{FS: fs, MemTableSize: 1 << 20}})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	pad := strings.Repeat("r", 512)
	var line []byte
	for i := 0; i < 1_000_000; i++ {
		q := int32(i % 2)
		m := msg("rot", q, fmt.Sprintf("%d-%s", i, pad))
		res, err := s.Put(context.Background(), []PutMessage{m})
		if err != nil {
			t.Fatalf("put %d: %v", i, err) // not the expected end: the parent requires the panic
		}
		line = fmt.Appendf(line[:0], "ack rot %d %d %d\n", q, res[0].QueueOffset, bodyHash(recordBody(m.Record)))
		if _, err := os.Stdout.Write(line); err != nil {
			t.Fatal(err)
		}
	}
	t.Fatal("no rotation fault after 1,000,000 puts")
}
