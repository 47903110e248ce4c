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

func TestRoundTripBothEncodings(t *testing.T) {
	for _, srvST := range []protocol.SerializeType{protocol.SerializeJSON, protocol.SerializeRocketMQ} {
		for _, cliST := range []protocol.SerializeType{protocol.SerializeJSON, protocol.SerializeRocketMQ} {
			t.Run(fmt.Sprintf("server%d-client%d", srvST, cliST), func(t *testing.T) {
				var gotLang atomic.Int32
				var gotVersion atomic.Int32
				s, addr := newTestServer(t, WithSerializeType(srvST))
				s.Handle(200, ProcessorFunc(func(ctx context.Context, rc *RequestCtx) (*protocol.Command, error) {
					gotLang.Store(int32(rc.Request().Language))
					gotVersion.Store(rc.Request().Version)
					resp := echoResponse(rc.Request())
					resp.SetExt("unicode", "é\u0001\"\\")
					return resp, nil
				}))
				c := dialT(t, addr, WithSerializeType(cliST))
				for i := range 10 {
					req := echoReq(i)
					req.Code = 200
					req.SetExt("unicode", "é\u0001\"\\")
					resp, err := c.Invoke(ctxT(t, 5*time.Second), req)
					if err != nil {
						t.Fatal(err)
					}
					if err := checkEcho(resp, i); err != nil {
						t.Fatal(err)
					}
					if v, _ := resp.Ext("unicode"); v != "é\u0001\"\\" {
						t.Fatalf("unicode ext %q", v)
					}
					if resp.Opaque != req.Opaque {
						t.Fatalf("opaque %d, want %d", resp.Opaque, req.Opaque)
					}
					if resp.Language != protocol.LanguageJava || resp.Version != protocol.CurrentVersion {
						t.Fatalf("response language %v version %d", resp.Language, resp.Version)
					}
				}
				if protocol.LanguageCode(gotLang.Load()) != protocol.LanguageGo || gotVersion.Load() != protocol.CurrentVersion {
					t.Fatalf("request language %v version %d", protocol.LanguageCode(gotLang.Load()), gotVersion.Load())
				}
				st := c.Stats()
				if st.FramesOut != 10 || st.FramesIn != 10 || st.BytesIn == 0 || st.BytesOut == 0 || st.InFlight != 0 {
					t.Fatalf("stats %+v", st)
				}
			})
		}
	}
}

func TestOpaquesArePerConn(t *testing.T) {
	_, addr := newTestServer(t)
	c1 := dialT(t, addr)
	c2 := dialT(t, addr)
	r1, r2 := echoReq(1), echoReq(2)
	if _, err := c1.Invoke(ctxT(t, 5*time.Second), r1); err != nil {
		t.Fatal(err)
	}
	if _, err := c2.Invoke(ctxT(t, 5*time.Second), r2); err != nil {
		t.Fatal(err)
	}
	if r1.Opaque != 1 || r2.Opaque != 1 {
		t.Fatalf("opaques %d %d, want 1 1 (per-Conn counters)", r1.Opaque, r2.Opaque)
	}
}

func TestGenericResponses(t *testing.T) {
	_, addr := newTestServer(t)
	c := dialT(t, addr)
	resp, err := c.Invoke(ctxT(t, 5*time.Second), protocol.NewRequest(9999))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Code != protocol.ResRequestCodeNotSupported || resp.Remark != " request type 9999 not supported" {
		t.Fatalf("unknown code: %d %q", resp.Code, resp.Remark)
	}
	req := protocol.NewRequest(codeErr)
	resp, err = c.Invoke(ctxT(t, 5*time.Second), req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Code != protocol.ResSystemError || resp.Remark != "boom "+strconv.Itoa(int(req.Opaque)) {
		t.Fatalf("processor error: %d %q", resp.Code, resp.Remark)
	}
}

// TestConcurrentOutOfOrder runs 64 goroutines whose requests the server
// answers after random delays, so responses come back out of order.
func TestConcurrentOutOfOrder(t *testing.T) {
	_, addr := newTestServer(t)
	c := dialT(t, addr)
	const goroutines, perG = 64, 60
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for i := range perG {
				n := g*perG + i
				req := echoReq(n)
				switch rng.IntN(4) {
				case 0:
					req.Code = codeDelay
					req.SetExtInt("ms", int64(rng.IntN(5)))
				case 1:
					req.Code = codeDefer
					req.SetExtInt("ms", int64(rng.IntN(5)))
				}
				resp, err := c.Invoke(ctxT(t, 10*time.Second), req)
				if err == nil {
					err = checkEcho(resp, n)
				}
				if err != nil {
					errs <- fmt.Errorf("goroutine %d request %d: %w", g, i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if st := c.Stats(); st.InFlight != 0 || st.DroppedResponses != 0 || st.FramesIn != goroutines*perG {
		t.Fatalf("stats %+v", st)
	}
}

func TestInvokeAsyncExactlyOnce(t *testing.T) {
	_, addr := newTestServer(t)
	c := dialT(t, addr, WithMaxInFlightAsync(16))
	const n = 500
	var calls [n]atomic.Int32
	var done sync.WaitGroup
	done.Add(n)
	var failures atomic.Int32
	for i := range n {
		req := echoReq(i)
		if i%3 == 0 {
			req.Code = codeDefer
			req.SetExtInt("ms", int64(i%4))
		}
		c.InvokeAsync(ctxT(t, 10*time.Second), req, func(resp *protocol.Command, err error) {
			if calls[i].Add(1) == 1 {
				defer done.Done()
			}
			if err == nil {
				err = checkEcho(resp, i)
			}
			if err != nil {
				failures.Add(1)
				t.Errorf("call %d: %v", i, err)
			}
		})
	}
	done.Wait()
	// Give a duplicate callback a chance to show up.
	if _, err := c.Invoke(ctxT(t, 5*time.Second), echoReq(0)); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if got := calls[i].Load(); got != 1 {
			t.Fatalf("callback %d ran %d times", i, got)
		}
	}
	if c.Stats().InFlight != 0 {
		t.Fatalf("in flight %d", c.Stats().InFlight)
	}
}

func TestInvokeAsyncTimeoutAndClose(t *testing.T) {
	_, addr := newTestServer(t)
	c := dialT(t, addr)
	// Timeout: the server answers after 2 s, the ctx ends after 50 ms.
	req := echoReq(1)
	req.Code = codeDefer
	req.SetExtInt("ms", 2000)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	got := make(chan error, 2)
	c.InvokeAsync(ctx, req, func(resp *protocol.Command, err error) { got <- err })
	select {
	case err := <-got:
		if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("async timeout err = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("async timeout callback never ran")
	}
	// Close: a pending async call fails with ErrConnClosed.
	req2 := echoReq(2)
	req2.Code = codeDefer
	req2.SetExtInt("ms", 5000)
	c.InvokeAsync(context.Background(), req2, func(resp *protocol.Command, err error) { got <- err })
	checkFor(t, 5*time.Second, time.Millisecond, func() error {
		if c.Stats().InFlight != 1 {
			return errors.New("not in flight yet")
		}
		return nil
	})
	c.Close()
	if err := <-got; !errors.Is(err, ErrConnClosed) {
		t.Fatalf("async close err = %v", err)
	}
	// After close: the callback runs at once with ErrConnClosed.
	c.InvokeAsync(context.Background(), echoReq(3), func(resp *protocol.Command, err error) { got <- err })
	if err := <-got; !errors.Is(err, ErrConnClosed) {
		t.Fatalf("async after close err = %v", err)
	}
	select {
	case err := <-got:
		t.Fatalf("extra callback: %v", err)
	default:
	}
}

func TestInvokeOneway(t *testing.T) {
	s, addr := newTestServer(t)
	var seen atomic.Int32
	s.Handle(300, ProcessorFunc(func(ctx context.Context, rc *RequestCtx) (*protocol.Command, error) {
		if !rc.Request().IsOneway() {
			t.Errorf("oneway bit missing")
		}
		seen.Add(1)
		return echoResponse(rc.Request()), nil // must not be sent
	}))
	c := dialT(t, addr)
	for range 20 {
		if err := c.InvokeOneway(ctxT(t, 5*time.Second), protocol.NewRequest(300)); err != nil {
			t.Fatal(err)
		}
	}
	// An unknown code and an error processor must not answer oneways either.
	for _, code := range []int32{9999, codeErr} {
		if err := c.InvokeOneway(ctxT(t, 5*time.Second), protocol.NewRequest(code)); err != nil {
			t.Fatal(err)
		}
	}
	checkFor(t, 5*time.Second, time.Millisecond, func() error {
		if seen.Load() != 20 {
			return fmt.Errorf("seen %d", seen.Load())
		}
		return nil
	})
	// A sync request after them: its response is the only frame to arrive.
	if _, err := c.Invoke(ctxT(t, 5*time.Second), echoReq(1)); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.FramesIn != 1 || st.DroppedResponses != 0 {
		t.Fatalf("oneway got answers: %+v", st)
	}
}

func TestDeferredResponse(t *testing.T) {
	s, addr := newTestServer(t)
	held := make(chan *RequestCtx, 1)
	s.Handle(301, ProcessorFunc(func(ctx context.Context, rc *RequestCtx) (*protocol.Command, error) {
		rc.Defer()
		held <- rc
		return nil, nil
	}))
	c := dialT(t, addr)
	type res struct {
		resp *protocol.Command
		err  error
	}
	out := make(chan res, 1)
	req := protocol.NewRequest(301)
	go func() {
		resp, err := c.Invoke(ctxT(t, 5*time.Second), req)
		out <- res{resp, err}
	}()
	rc := <-held
	select {
	case r := <-out:
		t.Fatalf("answered before Respond: %+v", r)
	case <-time.After(20 * time.Millisecond):
	}
	resp := protocol.NewResponse(rc.Request(), 0, "late")
	if err := rc.Respond(resp); err != nil {
		t.Fatal(err)
	}
	if err := rc.Respond(resp); !errors.Is(err, ErrAlreadyResponded) {
		t.Fatalf("second Respond: %v", err)
	}
	r := <-out
	if r.err != nil || r.resp.Remark != "late" || r.resp.Opaque != req.Opaque || !r.resp.IsResponse() {
		t.Fatalf("deferred: %+v %v", r.resp, r.err)
	}
	if c.Stats().DroppedResponses != 0 {
		t.Fatal("second Respond reached the wire")
	}
}

func TestServerInitiatedRequest(t *testing.T) {
	connected := make(chan *ServerConn, 1)
	_, addr := newTestServer(t, WithOnConnect(func(sc *ServerConn) { connected <- sc }))
	var onewaySeen atomic.Int32
	c := dialT(t, addr, WithRequestHandler(func(ctx context.Context, c *Conn, req *protocol.Command) *protocol.Command {
		if req.IsOneway() {
			onewaySeen.Add(1)
		}
		resp := protocol.NewResponse(req, 0, "from client")
		resp.Body = append([]byte("re:"), req.Body...)
		return resp
	}))
	// The client must send something for the connection to be accepted first.
	if _, err := c.Invoke(ctxT(t, 5*time.Second), echoReq(1)); err != nil {
		t.Fatal(err)
	}
	sc := <-connected
	req := protocol.NewRequest(39) // CHECK_TRANSACTION_STATE-like
	req.Body = []byte("check")
	resp, err := sc.Invoke(ctxT(t, 5*time.Second), req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Remark != "from client" || string(resp.Body) != "re:check" || resp.Opaque != req.Opaque {
		t.Fatalf("client answer %+v", resp)
	}
	if err := sc.InvokeOneway(ctxT(t, 5*time.Second), protocol.NewRequest(40)); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 5*time.Second, time.Millisecond, func() error {
		if onewaySeen.Load() != 1 {
			return errors.New("oneway not seen")
		}
		return nil
	})
	// A Conn without handler answers REQUEST_CODE_NOT_SUPPORTED.
	c2 := dialT(t, addr)
	if _, err := c2.Invoke(ctxT(t, 5*time.Second), echoReq(1)); err != nil {
		t.Fatal(err)
	}
	sc2 := <-connected
	resp, err = sc2.Invoke(ctxT(t, 5*time.Second), protocol.NewRequest(39))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Code != protocol.ResRequestCodeNotSupported {
		t.Fatalf("no-handler answer %+v", resp)
	}
	if sc.Stats().DroppedResponses != 0 {
		t.Fatal("oneway to client was answered")
	}
}

func TestInvokeTimeoutRemovesPending(t *testing.T) {
	_, addr := newTestServer(t)
	c := dialT(t, addr)
	req := echoReq(7)
	req.Code = codeDefer
	req.SetExtInt("ms", 100)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Invoke(ctx, req)
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
	if el := time.Since(start); el > time.Second {
		t.Fatalf("timeout took %v", el)
	}
	if st := c.Stats(); st.InFlight != 0 {
		t.Fatalf("pending not removed: %+v", st)
	}
	// The late response is dropped and counted.
	checkFor(t, 5*time.Second, time.Millisecond, func() error {
		if c.Stats().DroppedResponses != 1 {
			return fmt.Errorf("dropped %d", c.Stats().DroppedResponses)
		}
		return nil
	})
	// Cancellation (not a deadline) is reported as such.
	cctx, ccancel := context.WithCancel(context.Background())
	req2 := echoReq(8)
	req2.Code = codeDefer
	req2.SetExtInt("ms", 100)
	go func() {
		checkFor(t, 5*time.Second, time.Millisecond, func() error {
			if c.Stats().InFlight == 0 {
				return errors.New("not yet")
			}
			return nil
		})
		ccancel()
	}()
	if _, err := c.Invoke(cctx, req2); !errors.Is(err, context.Canceled) || errors.Is(err, ErrTimeout) {
		t.Fatalf("cancel err = %v", err)
	}
	// The Conn still works.
	if resp, err := c.Invoke(ctxT(t, 5*time.Second), echoReq(9)); err != nil || checkEcho(resp, 9) != nil {
		t.Fatalf("after timeout: %v", err)
	}
}

func TestCloseFailsPending(t *testing.T) {
	_, addr := newTestServer(t)
	c := dialT(t, addr)
	const n = 8
	errs := make(chan error, n)
	for i := range n {
		go func() {
			req := echoReq(i)
			req.Code = codeDefer
			req.SetExtInt("ms", 10000)
			_, err := c.Invoke(context.Background(), req)
			errs <- err
		}()
	}
	checkFor(t, 5*time.Second, time.Millisecond, func() error {
		if c.Stats().InFlight != n {
			return fmt.Errorf("in flight %d", c.Stats().InFlight)
		}
		return nil
	})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for range n {
		if err := <-errs; !errors.Is(err, ErrConnClosed) {
			t.Fatalf("pending err = %v", err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	select {
	case <-c.Done():
	default:
		t.Fatal("Done not closed")
	}
	if !errors.Is(c.Err(), ErrConnClosed) {
		t.Fatalf("Err = %v", c.Err())
	}
	if _, err := c.Invoke(context.Background(), echoReq(1)); !errors.Is(err, ErrConnClosed) {
		t.Fatalf("invoke after close: %v", err)
	}
	if err := c.InvokeOneway(context.Background(), echoReq(1)); !errors.Is(err, ErrConnClosed) {
		t.Fatalf("oneway after close: %v", err)
	}
}

func TestPeerCloseFailsPendingWithCause(t *testing.T) {
	s, addr := newTestServer(t)
	s.Control(codeDefer, DropConnection())
	c := dialT(t, addr)
	req := echoReq(1)
	req.Code = codeDefer
	_, err := c.Invoke(ctxT(t, 5*time.Second), req)
	if !errors.Is(err, ErrConnClosed) {
		t.Fatalf("err = %v", err)
	}
	<-c.Done()
	if !errors.Is(c.Err(), ErrConnClosed) || c.Err().Error() == ErrConnClosed.Error() {
		t.Fatalf("Err without cause: %v", c.Err())
	}
}

func TestControls(t *testing.T) {
	s, addr := newTestServer(t)
	c := dialT(t, addr)
	invoke := func(n int) *protocol.Command {
		t.Helper()
		resp, err := c.Invoke(ctxT(t, 5*time.Second), echoReq(n))
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	// One-shot: only the next request is affected.
	s.Control(codeEcho, RespondWith(protocol.ResSystemBusy, "busy"))
	if r := invoke(1); r.Code != protocol.ResSystemBusy || r.Remark != "busy" {
		t.Fatalf("forced code: %+v", r)
	}
	if r := invoke(2); checkEcho(r, 2) != nil {
		t.Fatalf("one-shot control persisted: %+v", r)
	}
	// Kept until removed; handled=false passes on.
	var seen atomic.Int32
	remove := s.KeepControl(AnyCode, func(rc *RequestCtx) (*protocol.Command, error, bool) {
		seen.Add(1)
		return nil, nil, false
	})
	invoke(3)
	invoke(4)
	remove()
	invoke(5)
	if seen.Load() != 2 {
		t.Fatalf("kept control ran %d times", seen.Load())
	}
	// Errors from a control; a *protocol.Error sets the response code.
	s.Control(codeEcho, func(rc *RequestCtx) (*protocol.Command, error, bool) {
		return nil, fmt.Errorf("wrapped: %w", &protocol.Error{Code: protocol.ResTopicNotExist, Remark: "topic not exist"}), true
	})
	if r := invoke(6); r.Code != protocol.ResTopicNotExist || r.Remark != "topic not exist" {
		t.Fatalf("coded error: %+v", r)
	}
	// Delay.
	s.Control(codeEcho, DelayReply(60*time.Millisecond))
	start := time.Now()
	if r := invoke(7); checkEcho(r, 7) != nil {
		t.Fatal(r)
	}
	if el := time.Since(start); el < 60*time.Millisecond {
		t.Fatalf("delay control: answered in %v", el)
	}
	if s.ctrl.n.Load() != 0 {
		t.Fatalf("%d controls left", s.ctrl.n.Load())
	}
}

func TestHandlerBoundAnswersBusy(t *testing.T) {
	s, addr := newTestServer(t, WithMaxConcurrentHandlers(2))
	release := make(chan struct{})
	s.Handle(302, ProcessorFunc(func(ctx context.Context, rc *RequestCtx) (*protocol.Command, error) {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return echoResponse(rc.Request()), nil
	}))
	c := dialT(t, addr)
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Invoke(ctxT(t, 5*time.Second), protocol.NewRequest(302)); err != nil {
				t.Error(err)
			}
		}()
	}
	checkFor(t, 5*time.Second, time.Millisecond, func() error {
		if c.Stats().InFlight != 2 {
			return errors.New("not in flight")
		}
		return nil
	})
	// Give the server time to start both processors, then a third request
	// must be refused at once, not queued.
	checkFor(t, 5*time.Second, time.Millisecond, func() error {
		resp, err := c.Invoke(ctxT(t, 5*time.Second), echoReq(1))
		if err != nil {
			t.Fatal(err)
		}
		if resp.Code != protocol.ResSystemBusy {
			return fmt.Errorf("code %d", resp.Code)
		}
		return nil
	})
	close(release)
	wg.Wait()
	if resp, err := c.Invoke(ctxT(t, 5*time.Second), echoReq(2)); err != nil || checkEcho(resp, 2) != nil {
		t.Fatalf("after release: %v %v", resp, err)
	}
}

func TestProcessorPanicAnswersSystemError(t *testing.T) {
	s, addr := newTestServer(t)
	s.Handle(303, ProcessorFunc(func(ctx context.Context, rc *RequestCtx) (*protocol.Command, error) {
		panic("processor bug")
	}))
	c := dialT(t, addr)
	resp, err := c.Invoke(ctxT(t, 5*time.Second), protocol.NewRequest(303))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Code != protocol.ResSystemError {
		t.Fatalf("%+v", resp)
	}
}

func TestConnectDisconnectHooks(t *testing.T) {
	var mu sync.Mutex
	var events []string
	disc := make(chan *ServerConn, 1)
	_, addr := newTestServer(t,
		WithOnConnect(func(sc *ServerConn) {
			sc.SetValue("k", "v")
			mu.Lock()
			events = append(events, "connect")
			mu.Unlock()
		}),
		WithOnDisconnect(func(sc *ServerConn) {
			mu.Lock()
			events = append(events, "disconnect")
			mu.Unlock()
			disc <- sc
		}))
	c := dialT(t, addr)
	if _, err := c.Invoke(ctxT(t, 5*time.Second), echoReq(1)); err != nil {
		t.Fatal(err)
	}
	c.Close()
	select {
	case sc := <-disc:
		if sc.Value("k") != "v" || !errors.Is(sc.Err(), ErrConnClosed) {
			t.Fatalf("value %v err %v", sc.Value("k"), sc.Err())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no disconnect")
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(events) != "[connect disconnect]" {
		t.Fatalf("events %v", events)
	}
}

func TestShutdownDrainsDeferred(t *testing.T) {
	s, addr := newTestServer(t)
	c := dialT(t, addr)
	idle := dialT(t, addr)
	if _, err := idle.Invoke(ctxT(t, 5*time.Second), echoReq(0)); err != nil {
		t.Fatal(err)
	}
	req := echoReq(1)
	req.Code = codeDefer
	req.SetExtInt("ms", 150)
	out := make(chan error, 1)
	go func() {
		resp, err := c.Invoke(ctxT(t, 5*time.Second), req)
		if err == nil {
			err = checkEcho(resp, 1)
		}
		out <- err
	}()
	checkFor(t, 5*time.Second, time.Millisecond, func() error {
		if c.Stats().InFlight != 1 {
			return errors.New("not yet")
		}
		return nil
	})
	// Wait until the server holds the deferred request.
	checkFor(t, 5*time.Second, time.Millisecond, func() error {
		for _, sc := range s.Conns() {
			if sc.handling.Load() == 1 {
				return nil
			}
		}
		return errors.New("not deferred yet")
	})
	if err := s.Shutdown(ctxT(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := <-out; err != nil {
		t.Fatalf("deferred request lost in Shutdown: %v", err)
	}
	<-idle.Done()
	if _, err := Dial(ctxT(t, time.Second), addr); err == nil {
		t.Fatal("dial after shutdown succeeded")
	}
	if err := s.Serve(rawListen(t)); !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve after shutdown: %v", err)
	}
}

func TestShutdownDeadline(t *testing.T) {
	s, addr := newTestServer(t)
	c := dialT(t, addr)
	req := echoReq(1)
	req.Code = codeDefer
	req.SetExtInt("ms", 10000)
	out := make(chan error, 1)
	go func() {
		_, err := c.Invoke(ctxT(t, 10*time.Second), req)
		out <- err
	}()
	checkFor(t, 5*time.Second, time.Millisecond, func() error {
		for _, sc := range s.Conns() {
			if sc.handling.Load() == 1 {
				return nil
			}
		}
		return errors.New("not deferred yet")
	})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := s.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown = %v", err)
	}
	if err := <-out; !errors.Is(err, ErrConnClosed) {
		t.Fatalf("abandoned request err = %v", err)
	}
}

func TestShutdownGoAway(t *testing.T) {
	s, addr := newTestServer(t)
	held := make(chan struct{})
	release := make(chan struct{})
	s.Handle(304, ProcessorFunc(func(ctx context.Context, rc *RequestCtx) (*protocol.Command, error) {
		close(held)
		<-release
		return echoResponse(rc.Request()), nil
	}))
	c := dialT(t, addr)
	go func() { _, _ = c.Invoke(ctxT(t, 5*time.Second), protocol.NewRequest(304)) }()
	<-held
	done := make(chan error, 1)
	go func() { done <- s.Shutdown(ctxT(t, 5*time.Second)) }()
	checkFor(t, 5*time.Second, time.Millisecond, func() error {
		if !s.going.Load() {
			return errors.New("not shutting down")
		}
		return nil
	})
	resp, err := c.Invoke(ctxT(t, 5*time.Second), echoReq(1)) // version 479 > 475
	if err != nil {
		t.Fatal(err)
	}
	if resp.Code != protocol.ResGoAway {
		t.Fatalf("during shutdown: %+v", resp)
	}
	old := echoReq(2)
	old.Version = 317 // rocketmq-client-go: still served
	if resp, err := c.Invoke(ctxT(t, 5*time.Second), old); err != nil || checkEcho(resp, 2) != nil {
		t.Fatalf("old client during shutdown: %v %v", resp, err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestSlowReaderClosedNotBuffered(t *testing.T) {
	// A client that pipelines requests and never reads: the server's write
	// queue fills and the connection is closed instead of growing.
	s, addr := newTestServer(t, WithWriteQueueFrames(4), WithWriteTimeout(200*time.Millisecond))
	big := make([]byte, 256<<10)
	s.Handle(305, ProcessorFunc(func(ctx context.Context, rc *RequestCtx) (*protocol.Command, error) {
		resp := protocol.NewResponse(rc.Request(), 0, "")
		resp.Body = big
		return resp, nil
	}))
	nc := rawDial(t, addr)
	frame, err := protocol.NewRequest(305).AppendFrame(nil, protocol.SerializeJSON)
	if err != nil {
		t.Fatal(err)
	}
	var all []byte
	for range 200 {
		all = append(all, frame...)
	}
	if _, err := nc.Write(all); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if n := len(s.Conns()); n != 0 {
			return fmt.Errorf("%d conns still open", n)
		}
		return nil
	})
}

func TestIdleTimeoutClosesClientConn(t *testing.T) {
	_, addr := newTestServer(t)
	c := dialT(t, addr, WithIdleTimeout(50*time.Millisecond))
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("idle conn not closed")
	}
	if !errors.Is(c.Err(), ErrConnClosed) {
		t.Fatal(c.Err())
	}
}

func TestOptionValidation(t *testing.T) {
	bad := []Option{
		WithSerializeType(7), WithMaxFrameSize(1), WithIdleTimeout(-1), WithWriteTimeout(-1),
		WithWriteQueueFrames(0), WithMaxConcurrentHandlers(0), WithMaxInFlightAsync(0),
		WithMaxInFlightOneway(0), WithVersion(1 << 20),
	}
	for i, o := range bad {
		if _, err := NewConn(nil, o); err == nil {
			t.Errorf("option %d accepted", i)
		}
	}
	if _, err := NewServer(WithPermissiveTLS()); err == nil {
		t.Error("permissive without TLS accepted")
	}
}

func TestInvokeBackpressureHonoursCtx(t *testing.T) {
	// A peer that never reads: the client's queue and socket buffers fill,
	// then Invoke must give up when its ctx ends.
	l := rawListen(t)
	accepted := make(chan struct{})
	go func() {
		nc, err := l.Accept()
		if err == nil {
			<-accepted
			nc.Close()
		}
	}()
	c := dialT(t, l.Addr().String(), WithWriteQueueFrames(1), WithWriteTimeout(0), WithMaxInFlightOneway(2))
	body := make([]byte, 1<<20)
	var err error
	deadline := time.Now().Add(10 * time.Second)
	for err == nil && time.Now().Before(deadline) {
		req := protocol.NewRequest(1)
		req.Body = body
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		err = c.InvokeOneway(ctx, req)
		cancel()
	}
	close(accepted)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v", err)
	}
}

type countingHooks struct {
	read, written, closed atomic.Int64
	bytes                 atomic.Int64
}

func (h *countingHooks) OnFrameRead(c *Conn, cmd *protocol.Command) { h.read.Add(1) }
func (h *countingHooks) OnFrameWritten(c *Conn, n int)              { h.written.Add(1); h.bytes.Add(int64(n)) }
func (h *countingHooks) OnConnClosed(c *Conn, err error)            { h.closed.Add(1) }

func TestHooks(t *testing.T) {
	_, addr := newTestServer(t)
	var h countingHooks
	c := dialT(t, addr, WithHooks(&h, "not a hook"))
	for i := range 5 {
		if _, err := c.Invoke(ctxT(t, 5*time.Second), echoReq(i)); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	st := c.Stats()
	if h.read.Load() != 5 || h.written.Load() != 5 || h.closed.Load() != 1 || h.bytes.Load() != st.BytesOut {
		t.Fatalf("hooks read %d written %d closed %d bytes %d (stats %+v)", h.read.Load(), h.written.Load(), h.closed.Load(), h.bytes.Load(), st)
	}
}

// TestReadAheadAndHandling checks what an inline processor learns of its
// connection: ReadAhead is true for a request read with more bytes
// already behind it (three frames in one write: the first two) and false
// for the last; Handling counts the request being served.
func TestReadAheadAndHandling(t *testing.T) {
	s, addr := newTestServer(t)
	type seen struct {
		ahead    bool
		handling int64
	}
	got := make(chan seen, 8)
	s.HandleInline(306, ProcessorFunc(func(ctx context.Context, rc *RequestCtx) (*protocol.Command, error) {
		got <- seen{rc.Conn().ReadAhead(), rc.Conn().Handling()}
		return protocol.NewResponse(rc.Request(), 0, ""), nil
	}))
	nc := rawDial(t, addr)
	var all []byte
	for i := range 3 {
		req := protocol.NewRequest(306)
		req.Opaque = int32(i + 1)
		var err error
		if all, err = req.AppendFrame(all, protocol.SerializeJSON); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := nc.Write(all); err != nil {
		t.Fatal(err)
	}
	want := []bool{true, true, false}
	for i, w := range want {
		select {
		case g := <-got:
			if g.ahead != w {
				t.Errorf("request %d: ReadAhead %v, want %v", i+1, g.ahead, w)
			}
			if g.handling != 1 {
				t.Errorf("request %d: Handling %d, want 1 (served inline, one at a time)", i+1, g.handling)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("request %d not served", i+1)
		}
	}
	// A lone request: nothing read ahead.
	c := dialT(t, addr)
	if _, err := c.Invoke(ctxT(t, 5*time.Second), protocol.NewRequest(306)); err != nil {
		t.Fatal(err)
	}
	if g := <-got; g.ahead || g.handling != 1 {
		t.Errorf("lone request: ReadAhead %v, Handling %d; want false, 1", g.ahead, g.handling)
	}
	if n := c.Handling(); n != 0 {
		t.Errorf("client Conn Handling %d, want 0", n)
	}
}
