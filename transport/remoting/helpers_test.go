package remoting

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/runnel-dev/runnel/transport/protocol"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Request codes used by the tests.
const (
	codeEcho   int32 = 100 // answers code 0, remark = request remark, body and ext "n" echoed
	codeDelay  int32 = 101 // sleeps ext "ms" milliseconds (ctx-aware), then echoes
	codeDefer  int32 = 102 // defers, answers from another goroutine after ext "ms"
	codeErr    int32 = 103 // returns an error
	codeSilent int32 = 104 // returns (nil, nil) without Defer
)

// testLogger logs to stderr when REMOTING_TEST_LOG is set, else discards.
func testLogger() *slog.Logger {
	if os.Getenv("REMOTING_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return nil
}

func echoResponse(req *protocol.Command) *protocol.Command {
	resp := protocol.NewResponse(req, 0, req.Remark)
	if v, ok := req.Ext("n"); ok {
		resp.SetExt("n", v)
	}
	resp.Body = req.Body
	return resp
}

func extMillis(req *protocol.Command) time.Duration {
	v, _ := req.Ext("ms")
	ms, _ := strconv.Atoi(v)
	return time.Duration(ms) * time.Millisecond
}

// newTestServer starts a Server with the test processors on 127.0.0.1:0 and
// closes it at cleanup.
func newTestServer(t testing.TB, opts ...ServerOption) (*Server, string) {
	t.Helper()
	opts = append([]ServerOption{WithLogger(testLogger())}, opts...)
	s, err := NewServer(opts...)
	if err != nil {
		t.Fatal(err)
	}
	s.Handle(codeEcho, ProcessorFunc(func(ctx context.Context, rc *RequestCtx) (*protocol.Command, error) {
		return echoResponse(rc.Request()), nil
	}))
	s.Handle(codeDelay, ProcessorFunc(func(ctx context.Context, rc *RequestCtx) (*protocol.Command, error) {
		t := time.NewTimer(extMillis(rc.Request()))
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return echoResponse(rc.Request()), nil
	}))
	s.Handle(codeDefer, ProcessorFunc(func(ctx context.Context, rc *RequestCtx) (*protocol.Command, error) {
		rc.Defer()
		d := extMillis(rc.Request())
		s.wg.Add(1) // the test's own goroutine, joined by Close like a processor's
		go func() {
			defer s.wg.Done()
			tm := time.NewTimer(d)
			defer tm.Stop()
			select {
			case <-tm.C:
			case <-rc.Conn().Done():
			}
			_ = rc.Respond(echoResponse(rc.Request()))
		}()
		return nil, nil
	}))
	s.Handle(codeErr, ProcessorFunc(func(ctx context.Context, rc *RequestCtx) (*protocol.Command, error) {
		return nil, fmt.Errorf("boom %d", rc.Request().Opaque)
	}))
	s.Handle(codeSilent, ProcessorFunc(func(ctx context.Context, rc *RequestCtx) (*protocol.Command, error) {
		return nil, nil
	}))
	addr, err := s.Listen(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("server close: %v", err)
		}
	})
	return s, addr.String()
}

func dialT(t testing.TB, addr string, opts ...Option) *Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	opts = append([]Option{WithLogger(testLogger())}, opts...)
	c, err := Dial(ctx, addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// checkFor polls fn every `every` until it returns nil or total passes.
func checkFor(t testing.TB, total, every time.Duration, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met after %v: %v", total, err)
		}
		tm := time.NewTimer(every)
		<-tm.C
	}
}

func echoReq(n int) *protocol.Command {
	req := protocol.NewRequest(codeEcho)
	req.SetExtInt("n", int64(n))
	req.Remark = "r" + strconv.Itoa(n)
	req.Body = []byte("body-" + strconv.Itoa(n))
	return req
}

func checkEcho(resp *protocol.Command, n int) error {
	if resp.Code != 0 || !resp.IsResponse() {
		return fmt.Errorf("resp code %d flag %d", resp.Code, resp.Flag)
	}
	if v, _ := resp.Ext("n"); v != strconv.Itoa(n) {
		return fmt.Errorf("resp n=%q, want %d", v, n)
	}
	if resp.Remark != "r"+strconv.Itoa(n) || string(resp.Body) != "body-"+strconv.Itoa(n) {
		return fmt.Errorf("resp remark %q body %q, want n=%d", resp.Remark, resp.Body, n)
	}
	return nil
}

// dialConns opens n plain TCP connections to addr, closed when the test
// ends (before the server the test started earlier).
func dialConns(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	ncs := make([]net.Conn, 0, n)
	t.Cleanup(func() {
		for _, nc := range ncs {
			_ = nc.Close()
		}
	})
	for range n {
		nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		ncs = append(ncs, nc)
	}
	return ncs
}

// readEcho reads the next frame from nc (within 10 s) and checks it is the
// echo of request n (checkEcho).
func readEcho(t *testing.T, nc net.Conn, n int) {
	t.Helper()
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := protocol.ReadFrame(bufio.NewReaderSize(nc, 256), 1<<20)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if err := checkEcho(resp, n); err != nil {
		t.Fatal(err)
	}
}
