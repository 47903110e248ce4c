package embedded

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// AnyCode given to Control or KeepControl matches requests of every code.
const AnyCode = remoting.AnyCode

// hook is one registered ControlFunc.
type hook struct {
	id     uint64
	code   int32
	broker string // "" = any broker
	keep   bool
	fn     remoting.ControlFunc
}

// hooks is a Cluster's fault-hook table, shared by its brokers so that a
// one-shot hook meant for any broker runs once in all.
type hooks struct {
	n  atomic.Int32
	mu struct {
		sync.Mutex
		list   []*hook
		nextID uint64
	}
}

func (hs *hooks) add(brokerName string, code int32, fn remoting.ControlFunc, keep bool) uint64 {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	hs.mu.nextID++
	hs.mu.list = append(hs.mu.list, &hook{id: hs.mu.nextID, code: code, broker: brokerName, keep: keep, fn: fn})
	hs.n.Add(1)
	return hs.mu.nextID
}

func (hs *hooks) remove(id uint64) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	hs.removeLocked(id)
}

func (hs *hooks) removeLocked(id uint64) {
	for i, h := range hs.mu.list {
		if h.id == id {
			hs.mu.list = append(hs.mu.list[:i:i], hs.mu.list[i+1:]...)
			hs.n.Add(-1)
			return
		}
	}
}

// next returns the first hook after id that matches code on brokerName,
// removing it when it is one-shot, so that each one-shot hook runs once.
func (hs *hooks) next(after uint64, brokerName string, code int32) *hook {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	for _, h := range hs.mu.list {
		if h.id > after && (h.code == code || h.code == AnyCode) && (h.broker == "" || h.broker == brokerName) {
			if !h.keep {
				hs.removeLocked(h.id)
			}
			return h
		}
	}
	return nil
}

// interceptor returns the remoting interceptor of broker brokerName.
func (hs *hooks) interceptor(brokerName string) remoting.Interceptor {
	return func(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, bool) {
		if hs.n.Load() == 0 {
			return nil, false
		}
		req := rc.Request()
		var after uint64
		for {
			h := hs.next(after, brokerName, req.Code)
			if h == nil {
				return nil, false
			}
			if resp, err, handled := h.fn(rc); handled {
				if err != nil {
					return errorResponse(req, err), true
				}
				return resp, true
			}
			after = h.id
		}
	}
}

// errorResponse answers req for a hook's error as a processor's error is
// answered: the code and remark of a *protocol.Error in err's chain, else
// SYSTEM_ERROR with err's text.
func errorResponse(req *protocol.Command, err error) *protocol.Command {
	var pe *protocol.Error
	if errors.As(err, &pe) {
		remark := pe.Remark
		if remark == "" {
			remark = err.Error()
		}
		return protocol.NewResponse(req, pe.Code, remark)
	}
	return protocol.NewResponse(req, protocol.ResSystemError, err.Error())
}
