package remoting

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// TestTrickledFrameHeap has 500 connections each send the first half of a
// frame, a byte at a time, and measures the live heap they hold while the
// frames are incomplete: the reader waits for the whole frame in the
// socket's receive queue, so a connection trickling a frame in must hold a
// few KiB, not the 32 KiB read buffer it held while its reader waited for
// the rest inside the frame's read (about 40 KiB per connection). Then the
// frames are finished, a byte at a time again, and each must be answered:
// the wait for a whole frame must not miss its last byte.
func TestTrickledFrameHeap(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the wait for a whole frame needs the receive queue's size (SIOCINQ) and SO_RCVLOWAT")
	}
	const conns = 500
	_, addr := newTestServer(t, WithMaxConnsPerIP(0))
	frame, err := echoReq(1).AppendFrame(nil, protocol.SerializeJSON)
	if err != nil {
		t.Fatal(err)
	}
	half := len(frame) / 2
	before := liveHeap()
	ncs := dialConns(t, addr, conns)
	// A byte per connection per round, so that each byte arrives on its
	// own (the reader wakes for the first ones, and counts what is queued).
	trickleBytes(t, ncs, frame[:half])
	time.Sleep(100 * time.Millisecond) // let the readers see the last bytes
	held := liveHeap()
	per := (float64(held) - float64(before)) / conns
	t.Logf("live heap: %.1f MiB before, %.1f MiB with %d connections %d bytes into a %d-byte frame: %.1f KiB per connection (server side and the test's net.Conn)",
		float64(before)/(1<<20), float64(held)/(1<<20), conns, half, len(frame), per/1024)
	if per > 16<<10 {
		t.Errorf("%.1f KiB of live heap per connection with a partial frame, want at most 16 KiB", per/1024)
	}
	trickleBytes(t, ncs, frame[half:])
	for _, nc := range ncs {
		readEcho(t, nc, 1)
	}
}

// trickleBytes writes b to every conn, one byte per connection per round.
func trickleBytes(t *testing.T, ncs []net.Conn, b []byte) {
	t.Helper()
	for i := range b {
		for _, nc := range ncs {
			if _, err := nc.Write(b[i : i+1]); err != nil {
				t.Fatalf("write: %v", err)
			}
		}
	}
}

// TestFrameInPieces sends frames in pieces with pauses between them: a
// frame larger than the read buffer (the reader waits for a buffer's worth,
// then reads the rest as it comes), a small one split inside its length
// word and inside its body, and a partial frame followed by the peer's
// close, which must close the connection at once rather than at the idle
// timeout.
func TestFrameInPieces(t *testing.T) {
	s, addr := newTestServer(t, WithIdleTimeout(time.Minute))
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = nc.Close() }()
	br := bufio.NewReader(nc)
	big := echoReq(2)
	big.Body = bytes.Repeat([]byte{'b'}, 3*readBufSize+100)
	bigFrame, err := big.AppendFrame(nil, protocol.SerializeJSON)
	if err != nil {
		t.Fatal(err)
	}
	small, err := echoReq(3).AppendFrame(nil, protocol.SerializeJSON)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		frame []byte
		cuts  []int
		n     int
		body  int
	}{
		{bigFrame, []int{2, 1000, readBufSize - 10, readBufSize + 10, 2*readBufSize + 5}, 2, len(big.Body)},
		{small, []int{1, 3, 4, 10, len(small) - 1}, 3, -1},
	} {
		prev := 0
		for _, cut := range append(tc.cuts, len(tc.frame)) {
			if _, err := nc.Write(tc.frame[prev:cut]); err != nil {
				t.Fatal(err)
			}
			prev = cut
			time.Sleep(20 * time.Millisecond)
		}
		_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := protocol.ReadFrame(br, 1<<20)
		if err != nil {
			t.Fatalf("frame %d: %v", tc.n, err)
		}
		if tc.body >= 0 {
			if v, _ := resp.Ext("n"); resp.Code != 0 || v != "2" || len(resp.Body) != tc.body {
				t.Fatalf("big frame: code %d n %q body %d bytes, want 0, 2, %d", resp.Code, v, len(resp.Body), tc.body)
			}
		} else if err := checkEcho(resp, tc.n); err != nil {
			t.Fatal(err)
		}
	}

	// A partial frame, then the peer's close.
	nc2, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc2.Write(small[:len(small)/2]); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 5*time.Second, 5*time.Millisecond, activeConns(s, 2))
	time.Sleep(50 * time.Millisecond)
	_ = nc2.Close()
	checkFor(t, 5*time.Second, 5*time.Millisecond, activeConns(s, 1)) // the idle timeout is a minute

}

func activeConns(s *Server, n int64) func() error {
	return func() error {
		if a := s.Stats().Active; a != n {
			return fmt.Errorf("%d connections open, want %d", a, n)
		}
		return nil
	}
}

// TestTrickledFrameIdleTimeout checks that a frame sent in parts gets the
// idle timeout from its first byte, as when its reader waited inside the
// frame's read: waiting for the rest without a buffer must not push the
// read deadline forward at each part.
func TestTrickledFrameIdleTimeout(t *testing.T) {
	const idle = time.Second
	s, addr := newTestServer(t, WithIdleTimeout(idle), WithFirstFrameTimeout(0))
	frame, err := echoReq(1).AppendFrame(nil, protocol.SerializeJSON)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = nc.Close() }()
	checkFor(t, 5*time.Second, 5*time.Millisecond, activeConns(s, 1))
	start := time.Now()
	if _, err := nc.Write(frame[:1]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(idle * 9 / 10)
	// The rest of the length word and a byte more: the reader wakes for
	// them and waits for the rest of the frame, which never comes.
	if _, err := nc.Write(frame[1:5]); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 5*time.Second, 5*time.Millisecond, activeConns(s, 0))
	// Pushed forward at the second part, the deadline would be 1.9 s after
	// the first byte.
	if took := time.Since(start); took > idle*8/5 {
		t.Errorf("connection with a partial frame closed %v after its first byte, idle timeout %v", took.Round(time.Millisecond), idle)
	}
}
