package remoting

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// Tests of sync callers reading their own responses (callerread.go).

func delayReq(n int, d time.Duration) *protocol.Command {
	req := echoReq(n)
	req.Code = codeDelay
	req.SetExtInt("ms", d.Milliseconds())
	return req
}

// invokeN makes n sequential echo calls on c.
func invokeN(t *testing.T, c *Conn, n int) {
	t.Helper()
	for i := range n {
		resp, err := c.Invoke(ctxT(t, 5*time.Second), echoReq(i))
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if err := checkEcho(resp, i); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
}

func TestCallerReadsOwnResponse(t *testing.T) {
	_, addr := newTestServer(t)
	t.Run("on", func(t *testing.T) {
		c := dialT(t, addr)
		invokeN(t, c, 300)
		// The first call is read by the reader goroutine, which then leaves
		// the read side to callers; it takes it back when it finds it
		// unheld after readerGrace, which costs the next call a hand-off.
		if got := c.Stats().CallerReads; got < 250 {
			t.Fatalf("CallerReads %d of 300 sequential calls, want most", got)
		}
	})
	t.Run("off", func(t *testing.T) {
		c := dialT(t, addr, WithCallerReads(false))
		invokeN(t, c, 50)
		if got := c.Stats().CallerReads; got != 0 {
			t.Fatalf("CallerReads %d with WithCallerReads(false)", got)
		}
	})
	t.Run("timeout calls", func(t *testing.T) {
		c := dialT(t, addr)
		for i := range 100 {
			resp, err := c.InvokeTimeout(context.Background(), echoReq(i), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if err := checkEcho(resp, i); err != nil {
				t.Fatal(err)
			}
		}
		if got := c.Stats().CallerReads; got < 80 {
			t.Fatalf("CallerReads %d of 100", got)
		}
	})
}

// pushServer starts a test server that reports each accepted connection.
func pushServer(t *testing.T) (addr string, conns <-chan *ServerConn) {
	ch := make(chan *ServerConn, 4)
	_, addr = newTestServer(t, WithOnConnect(func(sc *ServerConn) { ch <- sc }))
	return addr, ch
}

// pushed is a client RequestHandler answering code 300 with its ext "n".
func pushed(ctx context.Context, _ *Conn, req *protocol.Command) *protocol.Command {
	resp := protocol.NewResponse(req, 0, "pushed")
	if v, ok := req.Ext("n"); ok {
		resp.SetExt("n", v)
	}
	return resp
}

// push sends request n from the server side and checks the client's answer,
// returning how long it took.
func push(t *testing.T, sc *ServerConn, n int) time.Duration {
	t.Helper()
	req := protocol.NewRequest(300)
	req.SetExtInt("n", int64(n))
	start := time.Now()
	resp, err := sc.Invoke(ctxT(t, 5*time.Second), req)
	if err != nil {
		t.Fatalf("push %d: %v", n, err)
	}
	if v, _ := resp.Ext("n"); resp.Remark != "pushed" || v != strconv.Itoa(n) {
		t.Fatalf("push %d answered %q n=%q", n, resp.Remark, v)
	}
	return time.Since(start)
}

func TestCallerReadsServesPeerRequests(t *testing.T) {
	addr, conns := pushServer(t)
	c := dialT(t, addr, WithRequestHandler(pushed))
	invokeN(t, c, 3) // the read side is left to callers
	sc := <-conns

	// A caller holds the read side for 1.5 s: the server's request is read
	// by that caller and answered meanwhile.
	done := make(chan error, 1)
	before := c.Stats().CallerReads
	go func() {
		resp, err := c.Invoke(ctxT(t, 5*time.Second), delayReq(7, 1500*time.Millisecond))
		if err == nil {
			err = checkEcho(resp, 7)
		}
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	if d := push(t, sc, 1); d > time.Second {
		t.Fatalf("push answered after %v while a caller read", d)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if c.Stats().CallerReads != before+1 {
		t.Fatalf("the delayed call was not read by its caller (CallerReads %d -> %d)", before, c.Stats().CallerReads)
	}

	// Nobody holds the read side: the reader goroutine takes it back after
	// readerGrace and answers.
	invokeN(t, c, 2)
	for i := range 5 {
		if d := push(t, sc, 10+i); d > time.Second {
			t.Fatalf("push answered after %v with the read side unheld", d)
		}
		invokeN(t, c, 1)
	}
}

func TestCallerReadsOtherCalls(t *testing.T) {
	_, addr := newTestServer(t)
	c := dialT(t, addr)
	invokeN(t, c, 3)
	slow := make(chan error, 1)
	go func() {
		resp, err := c.Invoke(ctxT(t, 5*time.Second), delayReq(1, time.Second))
		if err == nil {
			err = checkEcho(resp, 1)
		}
		slow <- err
	}()
	time.Sleep(100 * time.Millisecond)
	// An async call and a sync call while the slow caller holds the read
	// side: both are answered long before it.
	async := make(chan error, 1)
	c.InvokeAsync(ctxT(t, 5*time.Second), echoReq(2), func(resp *protocol.Command, err error) {
		if err == nil {
			err = checkEcho(resp, 2)
		}
		if err == nil && !onReader() {
			// A caller reading its own response leaves callbacks to the
			// reader: they may wait for that very caller.
			err = errors.New("async callback run off the reader goroutine")
		}
		async <- err
	})
	start := time.Now()
	resp, err := c.Invoke(ctxT(t, 5*time.Second), echoReq(3))
	if err != nil {
		t.Fatal(err)
	}
	if err := checkEcho(resp, 3); err != nil {
		t.Fatal(err)
	}
	if err := <-async; err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Fatalf("calls behind a reading caller took %v", d)
	}
	select {
	case err := <-slow:
		t.Fatalf("the slow call ended early: %v", err)
	default:
	}
	if err := <-slow; err != nil {
		t.Fatal(err)
	}
	invokeN(t, c, 3)
}

func TestCallerReadsCallEnds(t *testing.T) {
	_, addr := newTestServer(t)
	for _, tc := range []struct {
		name string
		call func(c *Conn) error
		want error
	}{
		{"ctx cancelled", func(c *Conn) error {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(100*time.Millisecond, cancel)
			_, err := c.Invoke(ctx, delayReq(1, 3*time.Second))
			return err
		}, context.Canceled},
		{"ctx deadline", func(c *Conn) error {
			_, err := c.Invoke(ctxT(t, 100*time.Millisecond), delayReq(1, 3*time.Second))
			return err
		}, ErrTimeout},
		{"call timeout", func(c *Conn) error {
			_, err := c.InvokeTimeout(context.Background(), delayReq(1, 3*time.Second), 100*time.Millisecond)
			return err
		}, ErrTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialT(t, addr)
			invokeN(t, c, 3)
			start := time.Now()
			err := tc.call(c)
			if d := time.Since(start); !errors.Is(err, tc.want) || d < 90*time.Millisecond || d > time.Second {
				t.Fatalf("call ended after %v with %v, want %v after about 100ms", d, err, tc.want)
			}
			// The Conn goes on: the read deadline the call set is gone.
			invokeN(t, c, 20)
			time.Sleep(200 * time.Millisecond)
			invokeN(t, c, 5)
			if c.Err() != nil {
				t.Fatal(c.Err())
			}
			// The late response arrives after 3 s and is dropped.
			checkFor(t, 10*time.Second, 50*time.Millisecond, func() error {
				if n := c.Stats().DroppedResponses; n != 1 {
					return fmt.Errorf("dropped %d", n)
				}
				return nil
			})
		})
	}
}

func TestCallerReadsConnEnds(t *testing.T) {
	addr, conns := pushServer(t)
	for _, tc := range []struct {
		name string
		end  func(c *Conn, sc *ServerConn)
	}{
		{"local close", func(c *Conn, _ *ServerConn) { c.Close() }},
		{"peer close", func(_ *Conn, sc *ServerConn) { sc.Close() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialT(t, addr)
			invokeN(t, c, 3)
			sc := <-conns
			time.AfterFunc(100*time.Millisecond, func() { tc.end(c, sc) })
			start := time.Now()
			_, err := c.Invoke(ctxT(t, 10*time.Second), delayReq(1, 5*time.Second))
			if d := time.Since(start); !errors.Is(err, ErrConnClosed) || d > 2*time.Second {
				t.Fatalf("call ended after %v with %v, want ErrConnClosed at once", d, err)
			}
			select {
			case <-c.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("Conn not closed")
			}
			c.Close()
		})
	}
	t.Run("peer close, read side unheld", func(t *testing.T) {
		c := dialT(t, addr)
		invokeN(t, c, 3)
		sc := <-conns
		sc.Close()
		select {
		case <-c.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("peer's close not seen")
		}
	})
	t.Run("idle timeout, read side unheld", func(t *testing.T) {
		c := dialT(t, addr, WithIdleTimeout(300*time.Millisecond))
		invokeN(t, c, 3)
		start := time.Now()
		select {
		case <-c.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("idle Conn not closed")
		}
		if d := time.Since(start); d < 250*time.Millisecond {
			t.Fatalf("idle Conn closed after %v", d)
		}
	})
}

// TestCallerReadsMixed runs sync, timed, cancelled and async calls and
// server requests on one Conn at once, from several goroutines, with random
// pauses so that the read side changes hands often; every call must get its
// own response or its own error.
func TestCallerReadsMixed(t *testing.T) {
	addr, conns := pushServer(t)
	c := dialT(t, addr, WithRequestHandler(pushed))
	invokeN(t, c, 1)
	sc := <-conns
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var calls, pushes, cancelled atomic.Int64
	errc := make(chan error, 16)
	fail := func(err error) {
		select {
		case errc <- err:
		default:
		}
	}
	pause := func(r *rand.Rand) {
		if r.IntN(3) == 0 {
			time.Sleep(time.Duration(r.IntN(2000)) * time.Microsecond)
		}
	}
	for g := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for n := g * 1_000_000; ctx.Err() == nil; n++ {
				pause(r)
				switch r.IntN(4) {
				case 0, 1:
					resp, err := c.Invoke(context.Background(), echoReq(n))
					if err == nil {
						err = checkEcho(resp, n)
					}
					if err != nil {
						fail(fmt.Errorf("sync %d: %w", n, err))
						return
					}
				case 2:
					cctx, ccancel := context.WithTimeout(context.Background(), time.Duration(1+r.IntN(3))*time.Millisecond)
					resp, err := c.Invoke(cctx, delayReq(n, time.Duration(r.IntN(4))*time.Millisecond))
					ccancel()
					switch {
					case errors.Is(err, ErrTimeout):
						cancelled.Add(1)
					case err != nil:
						fail(fmt.Errorf("timed %d: %w", n, err))
						return
					default:
						if err := checkEcho(resp, n); err != nil {
							fail(fmt.Errorf("timed %d: %w", n, err))
							return
						}
					}
				case 3:
					done := make(chan error, 1)
					c.InvokeAsync(context.Background(), echoReq(n), func(resp *protocol.Command, err error) {
						if err == nil {
							err = checkEcho(resp, n)
						}
						if err == nil && !onReader() {
							err = errors.New("async callback run off the reader goroutine")
						}
						done <- err
					})
					if err := <-done; err != nil {
						fail(fmt.Errorf("async %d: %w", n, err))
						return
					}
				}
				calls.Add(1)
			}
		})
	}
	wg.Go(func() {
		for n := 0; ctx.Err() == nil; n++ {
			req := protocol.NewRequest(300)
			req.SetExtInt("n", int64(n))
			resp, err := sc.Invoke(context.Background(), req)
			if err == nil {
				if v, _ := resp.Ext("n"); v != strconv.Itoa(n) {
					err = fmt.Errorf("answered n=%q", v)
				}
			}
			if err != nil {
				fail(fmt.Errorf("push %d: %w", n, err))
				return
			}
			pushes.Add(1)
			time.Sleep(time.Millisecond)
		}
	})
	wg.Wait()
	select {
	case err := <-errc:
		t.Fatal(err)
	default:
	}
	st := c.Stats()
	t.Logf("%d calls (%d timed out), %d pushes, %d read by their caller", calls.Load(), cancelled.Load(), pushes.Load(), st.CallerReads)
	if calls.Load() < 1000 || pushes.Load() < 100 || st.CallerReads == 0 {
		t.Fatalf("too little done: %d calls, %d pushes, %d caller reads", calls.Load(), pushes.Load(), st.CallerReads)
	}
	if c.Err() != nil {
		t.Fatal(c.Err())
	}
	if st.InFlight != 0 {
		t.Fatalf("%d calls still in flight", st.InFlight)
	}
}
