package broker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/runnel-dev/runnel/transport/broker/internal/store"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// withStoreHook adjusts the store's options (tests only).
func withStoreHook(f func(*store.Options)) Option {
	return optionFunc(func(c *config) { c.storeHook = f })
}

// walSyncFault fails every fsync of a WAL file once armed (a disk that
// went bad), counting those attempted after the first failure.
type walSyncFault struct {
	armed  atomic.Bool
	failed atomic.Bool
	after  atomic.Int64
}

func (f *walSyncFault) MaybeError(op errorfs.Op) error {
	if !f.armed.Load() || !strings.HasSuffix(op.Path, ".log") {
		return nil
	}
	switch op.Kind {
	case errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo:
	default:
		return nil
	}
	if f.failed.Swap(true) {
		f.after.Add(1)
	}
	return errorfs.ErrInjected
}

func (f *walSyncFault) String() string { return "walSyncFault" }

// ackedMsg is a message a producer got SEND_OK for.
type ackedMsg struct {
	queue int32
	off   int64
	body  string
}

// produceUntilRefused sends from 4 connections until each gets a non-OK
// answer; it returns the acknowledged messages and the refusals, and fails
// the test if any answer took longer than a second.
func produceUntilRefused(t *testing.T, addr, topic string, bodySize int, stop func() bool) ([]ackedMsg, []*protocol.Command) {
	t.Helper()
	var mu sync.Mutex
	var acked []ackedMsg
	var refused []*protocol.Command
	var slow atomic.Int64
	var wg sync.WaitGroup
	for w := range 4 {
		c := dial(t, addr)
		wg.Go(func() {
			pad := strings.Repeat("x", bodySize)
			for i := 0; i < 200000 && !stop(); i++ {
				body := fmt.Sprintf("w%d-%d-%s", w, i, pad)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				start := time.Now()
				resp, err := c.Invoke(ctx, sendReq(topic, int32(w), []byte(body), ""))
				cancel()
				if d := time.Since(start); d > time.Second {
					slow.Store(int64(d))
				}
				if err != nil {
					t.Errorf("send: %v", err)
					return
				}
				if resp.Code != protocol.ResSuccess {
					mu.Lock()
					refused = append(refused, resp)
					mu.Unlock()
					return
				}
				var rh protocol.SendMessageResponseHeader
				if err := rh.Decode(resp); err != nil {
					t.Errorf("send response: %v", err)
					return
				}
				mu.Lock()
				acked = append(acked, ackedMsg{rh.QueueID, rh.QueueOffset, body})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if d := time.Duration(slow.Load()); d > 0 {
		t.Errorf("a send was answered after %v", d)
	}
	return acked, refused
}

// checkAcked pulls every acknowledged message back by queue and offset.
func checkAcked(t *testing.T, c *remoting.Conn, topic string, acked []ackedMsg) {
	t.Helper()
	checkAckedTail(t, c, topic, acked, false)
}

// checkAckedTail is checkAcked that, with lossyTail, accepts an
// acknowledged message missing at the end of its queue (at or past the
// queue's max offset), as an ASYNC-mode WAL failure may lose what was
// acknowledged since the last fsync; it returns how many were missing.
// A message below the max offset must still be there, unchanged.
func checkAckedTail(t *testing.T, c *remoting.Conn, topic string, acked []ackedMsg, lossyTail bool) (missing int) {
	t.Helper()
	for _, a := range acked {
		r := pull(t, c, pullArgs{topic: topic, queue: a.queue, offset: a.off, max: 1})
		if lossyTail && len(r.msgs) == 0 && a.off >= r.h.MaxOffset {
			missing++
			continue
		}
		if r.code != protocol.ResSuccess || len(r.msgs) != 1 || string(r.msgs[0].Body) != a.body ||
			r.msgs[0].QueueOffset != a.off {
			t.Fatalf("acknowledged message %d/%d lost: code %d, %d messages", a.queue, a.off, r.code, len(r.msgs))
		}
	}
	return missing
}

// TestSendFailedFsync fails the broker's WAL fsyncs under four producers,
// in both flush modes: each send is answered within a second, either
// SEND_OK or SERVICE_NOT_AVAILABLE "[STORE_FAILED]…"; the failed fsync is
// never retried; the broker goes on serving reads; after a restart every
// acknowledged message is there (in ASYNC mode but for a tail of each
// queue, acknowledged since the last fsync, that the store's WAL writer
// held in memory) and sends work again.
func TestSendFailedFsync(t *testing.T) {
	for _, mode := range []FlushMode{FlushSync, FlushAsync} {
		name := map[FlushMode]string{FlushSync: "sync", FlushAsync: "async"}[mode]
		t.Run(name, func(t *testing.T) { testSendFailedFsync(t, mode) })
	}
}

func testSendFailedFsync(t *testing.T, mode FlushMode) {
	dir := t.TempDir()
	fault := &walSyncFault{}
	b := newStartedBroker(t, WithDataDir(dir), WithFlushMode(mode), withStoreHook(func(o *store.Options) {
		o.PebbleOptions = &pebble.Options{FS: errorfs.Wrap(vfs.Default, fault)}
		o.SyncInterval = 5 * time.Millisecond
	}))
	c := dial(t, b.Addr())
	send(t, c, "Disk", 0, []byte("warm-up"), "")
	pull(t, c, pullArgs{topic: "Disk", max: 1}) // creates the consumer group before the failure
	var sent atomic.Int64
	acked, refused := produceUntilRefused(t, b.Addr(), "Disk", 100, func() bool {
		if sent.Add(1) == 200 {
			fault.armed.Store(true)
		}
		return false
	})
	if len(refused) != 4 {
		t.Fatalf("%d producers refused, want 4", len(refused))
	}
	for _, r := range refused {
		if r.Code != protocol.ResServiceNotAvailable || !strings.HasPrefix(r.Remark, "[STORE_FAILED]") ||
			strings.Contains(r.Remark, dir) {
			t.Fatalf("refusal: code %d %q", r.Code, r.Remark)
		}
	}
	t.Logf("%d sends acknowledged, refusal: %s", len(acked), refused[0].Remark)
	if h := b.StoreHealth(); !errors.Is(h.Failed, store.ErrFailed) {
		t.Fatalf("StoreHealth %+v", h)
	}
	// Reads keep working; the fsync is not retried by later sends.
	checkAcked(t, c, "Disk", acked)
	for range 3 {
		if resp := invoke(t, c, sendReq("Disk", 0, []byte("late"), "")); resp.Code != protocol.ResServiceNotAvailable {
			t.Fatalf("send after failure: %d %s", resp.Code, resp.Remark)
		}
	}
	if n := fault.after.Load(); n != 0 {
		t.Fatalf("%d WAL fsyncs after the failure", n)
	}
	if err := b.Close(); err == nil {
		t.Log("Close after the failure returned nil")
	}

	b = newStartedBroker(t, WithDataDir(dir))
	defer b.Close()
	c = dial(t, b.Addr())
	missing := checkAckedTail(t, c, "Disk", acked, mode == FlushAsync)
	t.Logf("after the restart: %d of %d acknowledged messages missing at their queues' ends", missing, len(acked))
	send(t, c, "Disk", 0, []byte("after restart"), "")
}

// ranInUserNS makes a tmpfs test possible without root: when this
// process is not root, it runs the test again in a child process in new
// user and mount namespaces (where the child is root of its own namespace
// and may mount a tmpfs; unprivileged user namespaces, as `unshare -rm`
// uses), reports the child's figures and result, and returns true: the
// caller then returns. As root (also in the child) it returns false. When
// the system refuses to create the namespaces the test is skipped.
func ranInUserNS(t *testing.T) bool {
	t.Helper()
	if os.Geteuid() == 0 {
		return false
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
	}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Skipf("not root, and no user namespace for a tmpfs: %v", err)
	}
	t.Logf("run in a user and mount namespace (not root):\n%s", out)
	if err != nil {
		t.Fatalf("in the user namespace: %v", err)
	}
	if !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("in the user namespace the test did not pass")
	}
	return true
}

// tmpfsWithFiller mounts an 8 MiB tmpfs in a temporary directory,
// unmounted at the end of the test, and half fills it with a 4 MiB file
// whose path it returns. It needs root, or root of a user namespace
// (ranInUserNS); it skips the test when it cannot mount.
func tmpfsWithFiller(t *testing.T) (mnt, filler string) {
	t.Helper()
	mnt = filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=8m"); err != nil {
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	filler = filepath.Join(mnt, "filler")
	if err := os.WriteFile(filler, make([]byte, 4<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	return mnt, filler
}

// TestSendDiskFullTmpfs runs a broker on an 8 MiB tmpfs half taken by a
// filler file: producers are refused with SERVICE_NOT_AVAILABLE
// "[DISK_FULL]…" once usage crosses the high-water mark (before the file
// system is full, so the store does not fail), no acknowledged message is
// lost, and sends succeed again by themselves once the filler is deleted.
// Not root, it runs in a user and mount namespace (ranInUserNS).
func TestSendDiskFullTmpfs(t *testing.T) {
	if ranInUserNS(t) {
		return
	}
	mnt, filler := tmpfsWithFiller(t)
	b := newStartedBroker(t, WithDataDir(filepath.Join(mnt, "data")), WithDiskHighWatermark(0.9),
		withStoreHook(func(o *store.Options) { o.DiskCheckInterval = 50 * time.Millisecond }))
	defer func() {
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	acked, refused := produceUntilRefused(t, b.Addr(), "Full", 8<<10, func() bool { return false })
	if len(refused) != 4 {
		t.Fatalf("%d producers refused, want 4", len(refused))
	}
	for _, r := range refused {
		if r.Code != protocol.ResServiceNotAvailable || !strings.HasPrefix(r.Remark, "[DISK_FULL]") {
			t.Fatalf("refusal: code %d %q", r.Code, r.Remark)
		}
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(mnt, &st); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d sends of 8 KiB acknowledged; tmpfs %d KiB free; refusal: %s",
		len(acked), st.Bavail*uint64(st.Bsize)>>10, refused[0].Remark)
	h := b.StoreHealth()
	if !h.DiskFull || h.DiskRefused == 0 || h.Failed != nil {
		t.Fatalf("StoreHealth %+v", h)
	}
	c := dial(t, b.Addr())
	checkAcked(t, c, "Full", acked)

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waitFor(t, 5*time.Second, "sends to resume", func() bool {
		return invoke(t, c, sendReq("Full", 0, []byte("resumed"), "")).Code == protocol.ResSuccess
	})
	t.Logf("sends resumed %v after the filler was deleted", time.Since(start).Round(time.Millisecond))
	if h := b.StoreHealth(); h.DiskFull || h.Failed != nil {
		t.Fatalf("StoreHealth after freeing space %+v", h)
	}
	checkAcked(t, c, "Full", acked)
}

// TestSendENOSPCTmpfs turns the high-water mark off on the same kind of
// tmpfs, so the file system really fills: sends are refused with
// SERVICE_NOT_AVAILABLE "[STORE_FAILED]…" (no space left on device) within
// a second, and after space is freed and the broker restarted every
// acknowledged message is there and sends work again.
//
// Not root, it runs in a user and mount namespace (ranInUserNS).
func TestSendENOSPCTmpfs(t *testing.T) {
	if ranInUserNS(t) {
		return
	}
	mnt, filler := tmpfsWithFiller(t)
	dir := filepath.Join(mnt, "data")
	b := newStartedBroker(t, WithDataDir(dir), WithDiskHighWatermark(1))
	acked, refused := produceUntilRefused(t, b.Addr(), "Full", 8<<10, func() bool { return false })
	if len(refused) != 4 {
		t.Fatalf("%d producers refused, want 4", len(refused))
	}
	for _, r := range refused {
		if r.Code != protocol.ResServiceNotAvailable || !strings.HasPrefix(r.Remark, "[STORE_FAILED]") ||
			!strings.Contains(r.Remark, "no space left on device") || strings.Contains(r.Remark, mnt) {
			t.Fatalf("refusal: code %d %q", r.Code, r.Remark)
		}
	}
	t.Logf("%d sends of 8 KiB acknowledged; refusal: %s", len(acked), refused[0].Remark)
	if err := b.Close(); err != nil {
		t.Logf("Close after the failure: %v", err)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	b = newStartedBroker(t, WithDataDir(dir), WithDiskHighWatermark(1))
	defer b.Close()
	c := dial(t, b.Addr())
	checkAcked(t, c, "Full", acked)
	send(t, c, "Full", 0, []byte("after restart"), "")
}
