package remoting

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// onReader reports whether the calling goroutine is a Conn's reader (the
// server's readLoop runs on the serveConn goroutine).
func onReader() bool {
	var buf [4 << 10]byte
	st := string(buf[:runtime.Stack(buf[:], false)])
	return strings.Contains(st, "(*Conn).readLoop") && !strings.Contains(st, "(*Conn).worker")
}

// TestHandleInline checks that an inline processor runs on the reader
// goroutine, one request at a time in arrival order, answers directly and
// by Defer/Respond, survives a panic, and that a registered control sends
// its requests to handler goroutines instead.
func TestHandleInline(t *testing.T) {
	s, addr := newTestServer(t)
	const codeInline, codeInlineDefer int32 = 400, 401
	var (
		running, maxRunning atomic.Int32
		notInline           atomic.Int32
		mu                  sync.Mutex
		order               []int64
	)
	s.HandleInline(codeInline, ProcessorFunc(func(ctx context.Context, rc *RequestCtx) (*protocol.Command, error) {
		n := running.Add(1)
		defer running.Add(-1)
		if n > maxRunning.Load() {
			maxRunning.Store(n)
		}
		if !onReader() {
			notInline.Add(1)
		}
		if v, _ := rc.Request().Ext("panic"); v == "1" {
			panic("inline boom")
		}
		mu.Lock()
		order = append(order, int64(rc.Request().Opaque))
		mu.Unlock()
		return echoResponse(rc.Request()), nil
	}))
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait) // before the server's Close (cleanups run last-in first-out)
	s.HandleInline(codeInlineDefer, ProcessorFunc(func(ctx context.Context, rc *RequestCtx) (*protocol.Command, error) {
		if !onReader() {
			notInline.Add(1)
		}
		rc.Defer()
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = rc.Respond(echoResponse(rc.Request()))
		}()
		return nil, nil
	}))
	c := dialT(t, addr)

	// Pipelined async requests: all answered, processed one at a time, in
	// the order they were sent (opaques increase).
	const n = 200
	errs := make(chan error, n)
	for i := range n {
		req := echoReq(i)
		req.Code = codeInline
		if i%2 == 1 {
			req.Code = codeInlineDefer
		}
		c.InvokeAsync(ctxT(t, 5*time.Second), req, func(resp *protocol.Command, err error) {
			if err == nil {
				err = checkEcho(resp, i)
			}
			errs <- err
		})
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if notInline.Load() != 0 || maxRunning.Load() != 1 {
		t.Fatalf("%d requests off the reader, %d at once", notInline.Load(), maxRunning.Load())
	}
	mu.Lock()
	for i := 1; i < len(order); i++ {
		if order[i] <= order[i-1] {
			t.Fatalf("processed out of order: %v", order)
		}
	}
	mu.Unlock()

	// A panic answers SYSTEM_ERROR and the connection keeps working.
	req := echoReq(1)
	req.Code = codeInline
	req.SetExt("panic", "1")
	resp, err := c.Invoke(ctxT(t, 5*time.Second), req)
	if err != nil || resp.Code != protocol.ResSystemError {
		t.Fatalf("panicking inline processor: %+v, %v", resp, err)
	}

	// With a control registered the request runs on a handler goroutine
	// (controls may block), and the control sees it.
	notInline.Store(0)
	remove := s.KeepControl(AnyCode, func(rc *RequestCtx) (*protocol.Command, error, bool) { return nil, nil, false })
	req = echoReq(2)
	req.Code = codeInline
	if resp, err := c.Invoke(ctxT(t, 5*time.Second), req); err != nil || checkEcho(resp, 2) != nil {
		t.Fatalf("with a control: %+v, %v", resp, err)
	}
	remove()
	if notInline.Load() != 1 {
		t.Fatalf("with a control registered the request ran inline")
	}
	if err := c.Err(); err != nil {
		t.Fatal(err)
	}
}
