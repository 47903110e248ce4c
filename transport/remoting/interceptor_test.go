package remoting

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// TestInterceptor checks that interceptors run in order before controls and
// processors, for registered and unregistered codes alike, and that a
// handled request never reaches the processor.
func TestInterceptor(t *testing.T) {
	var mu sync.Mutex
	var order []string
	note := func(s string) { mu.Lock(); order = append(order, s); mu.Unlock() }
	seen := func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), order...) }
	reset := func() { mu.Lock(); order = nil; mu.Unlock() }
	var reached atomic.Int32
	deny := func(_ context.Context, rc *RequestCtx) (*protocol.Command, bool) {
		note("deny")
		if v, _ := rc.Request().Ext("deny"); v == "1" {
			return protocol.NewResponse(rc.Request(), protocol.ResNoPermission, "denied"), true
		}
		return nil, false
	}
	silent := func(_ context.Context, rc *RequestCtx) (*protocol.Command, bool) {
		note("silent")
		if v, _ := rc.Request().Ext("silent"); v == "1" {
			return nil, true
		}
		return nil, false
	}
	s, addr := newTestServer(t, WithInterceptor(deny), WithInterceptor(nil), WithInterceptor(silent))
	s.KeepControl(AnyCode, func(rc *RequestCtx) (*protocol.Command, error, bool) {
		reached.Add(1)
		return nil, nil, false
	})
	c := dialT(t, addr)

	// Allowed: both interceptors, then the control, then the processor.
	resp, err := c.Invoke(ctxT(t, 5*time.Second), echoReq(1))
	if err != nil {
		t.Fatal(err)
	}
	if err := checkEcho(resp, 1); err != nil {
		t.Fatal(err)
	}
	if order := seen(); len(order) != 2 || order[0] != "deny" || order[1] != "silent" || reached.Load() != 1 {
		t.Fatalf("order %v, controls reached %d", order, reached.Load())
	}

	// Denied by the first: the second, the control and the processor never run.
	reset()
	req := echoReq(2)
	req.SetExt("deny", "1")
	resp, err = c.Invoke(ctxT(t, 5*time.Second), req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Code != protocol.ResNoPermission || resp.Remark != "denied" || resp.Opaque != req.Opaque {
		t.Fatalf("denied: code %d remark %q", resp.Code, resp.Remark)
	}
	if order := seen(); len(order) != 1 || reached.Load() != 1 {
		t.Fatalf("order %v, controls reached %d", order, reached.Load())
	}

	// A code without a processor is intercepted too, not answered NOT_SUPPORTED.
	reset()
	req = protocol.NewRequest(9999)
	req.SetExt("deny", "1")
	resp, err = c.Invoke(ctxT(t, 5*time.Second), req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Code != protocol.ResNoPermission {
		t.Fatalf("unregistered code: %d %q", resp.Code, resp.Remark)
	}

	// handled with a nil response answers nothing: the call times out.
	reset()
	req = echoReq(3)
	req.SetExt("silent", "1")
	if _, err := c.Invoke(ctxT(t, 200*time.Millisecond), req); err == nil {
		t.Fatal("a silently handled request was answered")
	}
	if reached.Load() != 1 {
		t.Fatalf("control reached by a handled request")
	}
}

// TestInterceptorPanic checks that a panicking interceptor fails closed:
// SYSTEM_ERROR, and the processor never runs.
func TestInterceptorPanic(t *testing.T) {
	s, addr := newTestServer(t, WithInterceptor(func(context.Context, *RequestCtx) (*protocol.Command, bool) {
		panic("interceptor bug")
	}))
	var reached atomic.Int32
	s.KeepControl(AnyCode, func(rc *RequestCtx) (*protocol.Command, error, bool) {
		reached.Add(1)
		return nil, nil, false
	})
	c := dialT(t, addr)
	resp, err := c.Invoke(ctxT(t, 5*time.Second), echoReq(1))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Code != protocol.ResSystemError || reached.Load() != 0 {
		t.Fatalf("code %d, controls reached %d", resp.Code, reached.Load())
	}
}
