package remoting

import "github.com/runnel-dev/runnel/transport/protocol"

// Hook is a value given to WithHooks that implements one or more of the
// Hook… interfaces below; the connection calls the ones it implements.
// Unknown hook types are ignored, so new hook interfaces never break
// existing ones. Hooks run synchronously on the connection's goroutines and
// must not block.
type Hook any

// HookFrameRead is called on the goroutine reading the connection (its
// reader goroutine, or a sync caller reading its own response: see
// WithCallerReads) for every frame read and decoded, before it is
// dispatched. cmd must not be retained or modified.
type HookFrameRead interface {
	OnFrameRead(c *Conn, cmd *protocol.Command)
}

// HookFrameWritten is called for every frame handed to the socket, with its
// size in bytes (length word included), on the goroutine that wrote it: the
// writer goroutine, or the one that sent the frame when it wrote it directly.
type HookFrameWritten interface {
	OnFrameWritten(c *Conn, bytes int)
}

// HookConnClosed is called once when the connection closes, with the error
// Err will return, on the goroutine that closed it.
type HookConnClosed interface {
	OnConnClosed(c *Conn, err error)
}

// hooks holds the hooks of one connection, sorted by interface.
type hooks struct {
	read    []HookFrameRead
	written []HookFrameWritten
	closed  []HookConnClosed
}

func newHooks(hs []Hook) hooks {
	var h hooks
	for _, x := range hs {
		if v, ok := x.(HookFrameRead); ok {
			h.read = append(h.read, v)
		}
		if v, ok := x.(HookFrameWritten); ok {
			h.written = append(h.written, v)
		}
		if v, ok := x.(HookConnClosed); ok {
			h.closed = append(h.closed, v)
		}
	}
	return h
}
