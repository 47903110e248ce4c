package remoting

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestInvokeTimeout checks the Conn-enforced timeout of a synchronous
// call: it fails with ErrTimeout about when due (not before), removes the
// call (its late response is dropped and counted), leaves calls without a
// deadline alone, and the Conn keeps working.
func TestInvokeTimeout(t *testing.T) {
	_, addr := newTestServer(t)
	c := dialT(t, addr)
	ctx := ctxT(t, 10*time.Second)

	slow := echoReq(1)
	slow.Code = codeDefer
	slow.SetExtInt("ms", 300)
	start := time.Now()
	_, err := c.InvokeTimeout(ctx, slow, 50*time.Millisecond)
	el := time.Since(start)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	if el < 50*time.Millisecond || el > 250*time.Millisecond {
		t.Fatalf("timed out after %v, want about 50ms", el)
	}
	if st := c.Stats(); st.InFlight != 0 {
		t.Fatalf("pending not removed: %+v", st)
	}
	checkFor(t, 5*time.Second, time.Millisecond, func() error {
		if n := c.Stats().DroppedResponses; n != 1 {
			return fmt.Errorf("dropped %d", n)
		}
		return nil
	})

	// A timeout longer than the call's wait does not fire, and a pooled
	// call that had a deadline carries none into a plain Invoke.
	within := echoReq(2)
	within.Code = codeDefer
	within.SetExtInt("ms", 20)
	if resp, err := c.InvokeTimeout(ctx, within, 5*time.Second); err != nil || checkEcho(resp, 2) != nil {
		t.Fatalf("within timeout: %v %v", resp, err)
	}
	plain := echoReq(3)
	plain.Code = codeDefer
	plain.SetExtInt("ms", 100)
	if resp, err := c.Invoke(ctx, plain); err != nil || checkEcho(resp, 3) != nil {
		t.Fatalf("plain invoke after timed ones: %v %v", resp, err)
	}
	c.mu.Lock()
	timed := c.mu.timed
	c.mu.Unlock()
	if timed != 0 {
		t.Fatalf("%d timed calls still counted", timed)
	}
}
