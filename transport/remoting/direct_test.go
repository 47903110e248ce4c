package remoting

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// TestDirectWriteCutShortKeepsOrder sends large frames from several
// goroutines over plain TCP with small socket buffers, so that the socket
// often takes only part of a frame written directly: the rest must go to
// the writer ahead of every frame queued meanwhile. The peer reads
// everything and checks every frame arrived whole, each sender's in order.
func TestDirectWriteCutShortKeepsOrder(t *testing.T) {
	lc := net.ListenConfig{Control: sockBuf(syscall.SO_RCVBUF, 4096)}
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		nc, err := l.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- nc
	}()
	const senders, each = 4, 24
	body := bytes.Repeat([]byte{'x'}, 48<<10)
	d := net.Dialer{Control: sockBuf(syscall.SO_SNDBUF, 4096)}
	nc, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewConn(nc, WithLogger(testLogger()), WithWriteQueueFrames(1024))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The first direct write cut short queues one more frame before the
	// rest of its own is queued, as a concurrent sender may.
	var once sync.Once
	c.onCut = func() {
		once.Do(func() {
			req := protocol.NewRequest(codeEcho)
			req.Remark = strconv.Itoa(senders) + "-0"
			req.Body = body
			if err := c.InvokeOneway(context.Background(), req); err != nil {
				t.Errorf("oneway during a cut: %v", err)
			}
		})
	}
	peer, ok := <-accepted
	if !ok {
		t.Fatal("accept failed")
	}
	defer peer.Close()

	// Several senders, so that frames get queued while a direct write
	// is under way: the rest of a frame cut short must still go first.
	const frames = senders*each + 1
	ctx := ctxT(t, 10*time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, senders)
	for g := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				req := protocol.NewRequest(codeEcho)
				req.Remark = strconv.Itoa(g) + "-" + strconv.Itoa(i)
				req.Body = body
				if err := c.InvokeOneway(ctx, req); err != nil {
					errs <- fmt.Errorf("oneway %s: %w", req.Remark, err)
					return
				}
			}
		}()
	}
	br := bufio.NewReader(peer)
	_ = peer.SetReadDeadline(time.Now().Add(10 * time.Second))
	next := make([]int, senders+1)
	for i := range frames {
		cmd, err := protocol.ReadFrame(br, 1<<20)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		var g, n int
		if _, err := fmt.Sscanf(cmd.Remark, "%d-%d", &g, &n); err != nil || g < 0 || g > senders {
			t.Fatalf("frame %d: remark %q", i, cmd.Remark)
		}
		if n != next[g] || !bytes.Equal(cmd.Body, body) {
			t.Fatalf("frame %d: remark %q (want %d-%d), body of %d bytes", i, cmd.Remark, g, next[g], len(cmd.Body))
		}
		next[g]++
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if c.cut.Load() == 0 {
		t.Fatal("no direct write was cut short: the test does not exercise the hand-over")
	}
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if st := c.Stats(); st.FramesOut != frames {
			return fmt.Errorf("frames out %d, want %d", st.FramesOut, frames)
		}
		return nil
	})
}

// sockBuf returns a dialer or listener Control func setting the socket
// option opt (SO_RCVBUF, SO_SNDBUF) to n.
func sockBuf(opt, n int) func(string, string, syscall.RawConn) error {
	return func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, opt, n)
		}); err != nil {
			return err
		}
		return serr
	}
}

// TestDirectWriteRoundTrips runs sequential calls in both directions of a
// Server connection, each a direct write on its side, with bodies large
// and small, and checks every answer.
func TestDirectWriteRoundTrips(t *testing.T) {
	_, addr := newTestServer(t)
	c := dialT(t, addr)
	ctx := ctxT(t, 10*time.Second)
	for i := range 200 {
		req := echoReq(i)
		if i%10 == 0 {
			req.Body = bytes.Repeat([]byte{byte(i)}, 256<<10)
		}
		resp, err := c.Invoke(ctx, req)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if !bytes.Equal(resp.Body, req.Body) {
			t.Fatalf("call %d: body of %d bytes, want %d", i, len(resp.Body), len(req.Body))
		}
	}
	if st := c.Stats(); st.FramesOut != 200 || st.FramesIn != 200 {
		t.Fatalf("stats %+v", st)
	}
}
