package remoting

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// TestInvokeAsyncTimeout covers the Conn-enforced timeout: a late answer
// times out (ErrTimeout, after the timeout and within the sweep's slack of
// it), answered calls are not touched by the sweep, calls with different
// timeouts each time out in turn, a ctx that ends first still wins, and
// Close fails pending timed calls with ErrConnClosed. Every callback runs
// exactly once.
func TestInvokeAsyncTimeout(t *testing.T) {
	_, addr := newTestServer(t)
	c := dialT(t, addr)
	deferReq := func(ms int64) *protocol.Command {
		req := echoReq(int(ms))
		req.Code = codeDefer
		req.SetExtInt("ms", ms)
		return req
	}

	type outcome struct {
		err     error
		elapsed time.Duration
	}
	var calls atomic.Int64
	invoke := func(ctx context.Context, req *protocol.Command, timeout time.Duration) <-chan outcome {
		ch := make(chan outcome, 2)
		start := time.Now()
		c.InvokeAsyncTimeout(ctx, req, timeout, func(resp *protocol.Command, err error) {
			calls.Add(1)
			ch <- outcome{err, time.Since(start)}
		})
		return ch
	}
	wait := func(ch <-chan outcome) outcome {
		t.Helper()
		select {
		case o := <-ch:
			return o
		case <-time.After(10 * time.Second):
			t.Fatal("callback never ran")
			return outcome{}
		}
	}

	// Answered well within the timeout, many at once: no error.
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			if o := wait(invoke(context.Background(), echoReq(i), 5*time.Second)); o.err != nil {
				t.Errorf("answered call %d: %v", i, o.err)
			}
		})
	}
	wg.Wait()

	// Late answers with staggered timeouts time out in turn; an answer
	// inside its timeout among them still succeeds.
	slow80 := invoke(context.Background(), deferReq(3000), 80*time.Millisecond)
	slow30 := invoke(context.Background(), deferReq(3000), 30*time.Millisecond)
	fast := invoke(context.Background(), deferReq(10), 2*time.Second)
	for _, tc := range []struct {
		ch <-chan outcome
		d  time.Duration
	}{{slow30, 30 * time.Millisecond}, {slow80, 80 * time.Millisecond}} {
		o := wait(tc.ch)
		if !errors.Is(o.err, ErrTimeout) {
			t.Fatalf("late call (%v): err %v, want ErrTimeout", tc.d, o.err)
		}
		if o.elapsed < tc.d {
			t.Fatalf("late call (%v) timed out after only %v", tc.d, o.elapsed)
		}
	}
	if o := wait(fast); o.err != nil {
		t.Fatalf("call answered inside its timeout: %v", o.err)
	}

	// A ctx that ends first wins over a long timeout.
	ctx, cancel := context.WithCancel(context.Background())
	ctxCall := invoke(ctx, deferReq(3000), time.Minute)
	cancel()
	if o := wait(ctxCall); !errors.Is(o.err, context.Canceled) {
		t.Fatalf("cancelled call: %v", o.err)
	}

	// Close fails a pending timed call.
	pending := invoke(context.Background(), deferReq(5000), time.Minute)
	checkFor(t, 5*time.Second, time.Millisecond, func() error {
		if c.Stats().InFlight != 1 {
			return errors.New("not in flight yet")
		}
		return nil
	})
	c.Close()
	if o := wait(pending); !errors.Is(o.err, ErrConnClosed) {
		t.Fatalf("pending call at close: %v", o.err)
	}
	if n, want := calls.Load(), int64(50+3+1+1); n != want {
		t.Fatalf("%d callbacks, want %d", n, want)
	}
	if st := c.Stats(); st.InFlight != 0 {
		t.Fatalf("in flight after close: %d", st.InFlight)
	}
}
