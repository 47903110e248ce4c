//go:build unix

package remoting

import (
	"errors"
	"net"
	"sync"
	"syscall"
)

// sock does non-blocking operations on a plain TCP connection's socket,
// through its syscall.RawConn, so that the connection's writer and reader
// goroutines can be skipped or can give their buffers back while idle.
// Its state is used by one goroutine at a time: the one owning the socket's
// write side (Conn.wq.writing) for write, the reader for waitReadable.
type sock struct {
	rc syscall.RawConn

	// write's state, shared with writeFn (a method value bound once, so
	// that a write allocates nothing).
	wb      []byte
	wn      int
	werr    error
	writeFn func(fd uintptr) bool

	// waitReadable's state.
	waited bool
	peek   [1]byte
	readFn func(fd uintptr) bool

	// unsent's state: any goroutine answering a request may call it.
	unsentMu sync.Mutex
	unsentN  int
	unsentFn func(fd uintptr)
}

// newSock returns the sock of nc, or nil when nc is not a plain TCP
// connection (TLS, pipes, wrappers): those use the writer goroutine and a
// read buffer kept for the connection's life.
func newSock(nc net.Conn) *sock {
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	s := &sock{rc: rc}
	s.writeFn = s.doWrite
	s.readFn = s.doPeek
	s.unsentFn = s.doUnsent
	return s
}

// unsent returns the bytes the socket has taken but the peer has not yet
// acknowledged (written but not yet read, when the peer has stopped
// reading): they count towards the connection's output bound. 0 where
// the system does not tell, or once the connection is closed.
func (s *sock) unsent() int {
	s.unsentMu.Lock()
	defer s.unsentMu.Unlock()
	s.unsentN = 0
	if err := s.rc.Control(s.unsentFn); err != nil {
		return 0 // closed
	}
	return s.unsentN
}

func (s *sock) doUnsent(fd uintptr) { s.unsentN = socketUnsent(fd) }

// write writes as much of b as the socket takes without waiting, and
// returns how much that was. An error means the connection failed, except
// for an expired write deadline, reported as 0 bytes written (the writer
// goroutine, which sets deadlines, takes over).
func (s *sock) write(b []byte) (int, error) {
	s.wb, s.wn, s.werr = b, 0, nil
	err := s.rc.Write(s.writeFn)
	n, werr := s.wn, s.werr
	s.wb, s.werr = nil, nil
	if err != nil {
		if isTimeout(err) {
			return 0, nil
		}
		return n, err
	}
	return n, werr
}

func (s *sock) doWrite(fd uintptr) bool {
	for s.wn < len(s.wb) {
		n, err := syscall.Write(int(fd), s.wb[s.wn:])
		switch {
		case err == nil:
			s.wn += n
		case errors.Is(err, syscall.EINTR):
		case errors.Is(err, syscall.EAGAIN):
			return true // full: the rest goes to the writer goroutine
		default:
			s.werr = err
			return true
		}
	}
	return true
}

// waitReadable blocks until the socket has bytes to read (or its peer
// closed it), or the read deadline passes, without a read buffer.
func (s *sock) waitReadable() error {
	s.waited = false
	return s.rc.Read(s.readFn)
}

// doPeek reports readability: a first call peeks at one byte (not
// consuming it) and asks to wait when there is none; the call after the
// wait reports ready (a rare spurious wake-up makes the following read wait
// again, with its buffer).
func (s *sock) doPeek(fd uintptr) bool {
	if s.waited {
		return true
	}
	for {
		_, _, err := syscall.Recvfrom(int(fd), s.peek[:], syscall.MSG_PEEK)
		switch {
		case err == nil:
			return true // data, or 0 bytes for EOF: the read reports it
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.EAGAIN):
			s.waited = true
			return false
		default:
			return true // the read that follows reports the error
		}
	}
}
