package remoting

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// levelCapture records the messages logged at Info or above.
type levelCapture struct {
	mu   sync.Mutex
	msgs []string
}

func (h *levelCapture) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }
func (h *levelCapture) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.msgs = append(h.msgs, r.Level.String()+" "+r.Message)
	return nil
}
func (h *levelCapture) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *levelCapture) WithGroup(string) slog.Handler      { return h }

func (h *levelCapture) count(substr string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, m := range h.msgs {
		if strings.Contains(m, substr) {
			n++
		}
	}
	return n
}

// TestServerPeerFaultsLoggedOncePerInterval has many connections send
// malformed frames and many requests make a processor panic: every event
// is counted in ServerStats, and each kind is logged once in the interval
// (at Info or above; the connections' own lines are at Debug).
func TestServerPeerFaultsLoggedOncePerInterval(t *testing.T) {
	const bad = 8
	h := &levelCapture{}
	s, addr := newTestServer(t, WithLogger(slog.New(h)), WithLimitLogInterval(time.Hour))
	const codePanic int32 = 190
	s.Handle(codePanic, ProcessorFunc(func(context.Context, *RequestCtx) (*protocol.Command, error) { panic("boom") }))

	garbage := jsonFrame(`{"code":100,`) // truncated JSON header
	for range bad {
		nc := rawDial(t, addr)
		if _, err := nc.Write(garbage); err != nil {
			t.Fatal(err)
		}
		waitClosedByPeer(t, nc, 5*time.Second)
	}
	checkFor(t, 5*time.Second, 5*time.Millisecond, statsCheck(s, "MalformedFrames", bad, func(st ServerStats) int64 { return st.MalformedFrames }))

	c := dialT(t, addr)
	for i := range bad {
		req := echoReq(i)
		req.Code = codePanic
		resp, err := c.Invoke(ctxT(t, 5*time.Second), req)
		if err != nil || resp.Code != protocol.ResSystemError {
			t.Fatalf("panicking processor answered %v, %v", resp, err)
		}
	}
	if st := s.Stats(); st.ProcessorPanics != bad {
		t.Fatalf("ProcessorPanics %d, want %d", st.ProcessorPanics, bad)
	}
	if n := h.count("malformed frame"); n != 1 {
		t.Errorf("malformed frames logged %d times in one interval, want 1: %q", n, h.msgs)
	}
	if n := h.count("processor panicked"); n != 1 {
		t.Errorf("panics logged %d times in one interval, want 1: %q", n, h.msgs)
	}
}
