package remoting

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// AnyCode given to Control or KeepControl matches requests of every code.
const AnyCode int32 = math.MinInt32

// ControlFunc intercepts a request before its processor, for fault
// injection in tests. It returns handled=false to let the request go on (to
// the next control, then the processor), or handled=true with the outcome,
// treated as the processor's would be: (resp, nil) answers resp, (nil, err)
// answers an error response, (nil, nil) answers nothing. It runs on the
// request's processor goroutine and may block (see DelayReply).
type ControlFunc func(rc *RequestCtx) (resp *protocol.Command, err error, handled bool)

// control is one registered ControlFunc.
type control struct {
	id   uint64
	code int32
	keep bool
	fn   ControlFunc
}

// controls is a Server's fault-injection table. n makes the common case,
// no controls, one atomic load per request.
type controls struct {
	n  atomic.Int32
	mu struct {
		sync.Mutex
		list   []*control // in registration order
		nextID uint64
	}
}

// Control registers fn for the next request with the given code (or
// AnyCode): fn runs once, for that request, and is removed whatever it
// returns. Controls run in registration order, before the processor.
func (s *Server) Control(code int32, fn ControlFunc) {
	s.ctrl.add(code, fn, false)
}

// KeepControl registers fn for every request with the given code (or
// AnyCode) until the returned function is called.
func (s *Server) KeepControl(code int32, fn ControlFunc) (remove func()) {
	id := s.ctrl.add(code, fn, true)
	return func() { s.ctrl.remove(id) }
}

func (cs *controls) add(code int32, fn ControlFunc, keep bool) uint64 {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.mu.nextID++
	cs.mu.list = append(cs.mu.list, &control{id: cs.mu.nextID, code: code, keep: keep, fn: fn})
	cs.n.Add(1)
	return cs.mu.nextID
}

func (cs *controls) remove(id uint64) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.removeLocked(id)
}

func (cs *controls) removeLocked(id uint64) bool {
	for i, c := range cs.mu.list {
		if c.id == id {
			cs.mu.list = append(cs.mu.list[:i:i], cs.mu.list[i+1:]...)
			cs.n.Add(-1)
			return true
		}
	}
	return false
}

// next returns the first control after id matching code, removing it when
// one-shot, so that each one-shot control runs exactly once.
func (cs *controls) next(after uint64, code int32) *control {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for _, c := range cs.mu.list {
		if c.id > after && (c.code == code || c.code == AnyCode) {
			if !c.keep {
				cs.removeLocked(c.id)
			}
			return c
		}
	}
	return nil
}

// run runs the matching controls in order until one handles rc.
func (cs *controls) run(rc *RequestCtx) (*protocol.Command, error, bool) {
	var after uint64
	for {
		c := cs.next(after, rc.req.Code)
		if c == nil {
			return nil, nil, false
		}
		if resp, err, handled := c.fn(rc); handled {
			return resp, err, true
		}
		after = c.id
	}
}

// DelayReply returns a ControlFunc that holds the request for d (less if its
// connection closes) and then lets it go on to its processor.
func DelayReply(d time.Duration) ControlFunc {
	return func(rc *RequestCtx) (*protocol.Command, error, bool) {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-rc.conn.Done():
		}
		return nil, nil, false
	}
}

// DropConnection returns a ControlFunc that closes the request's connection
// without answering.
func DropConnection() ControlFunc {
	return func(rc *RequestCtx) (*protocol.Command, error, bool) {
		_ = rc.conn.Close() // never fails
		return nil, nil, true
	}
}

// RespondWith returns a ControlFunc that answers with the given response
// code and remark instead of running the processor (for example SYSTEM_BUSY,
// to exercise a client's retries).
func RespondWith(code int32, remark string) ControlFunc {
	return func(rc *RequestCtx) (*protocol.Command, error, bool) {
		return protocol.NewResponse(rc.req, code, remark), nil, true
	}
}
