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

	// queued's and waitQueued's state (the reader's).
	queuedN  int
	lowatN   int
	lowatErr error
	want     int
	wantWait bool
	queuedFn func(fd uintptr)
	lowatFn  func(fd uintptr)
	wantFn   func(fd uintptr) bool

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
	s.queuedFn = s.doQueued
	s.lowatFn = s.doSetLowat
	s.wantFn = s.doWaitQueued
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

// queued returns the bytes in the socket's receive queue, or -1 where the
// system does not tell (frameWaitSupported) or once the connection is
// closed.
func (s *sock) queued() int {
	s.queuedN = -1
	if err := s.rc.Control(s.queuedFn); err != nil {
		return -1
	}
	return s.queuedN
}

func (s *sock) doQueued(fd uintptr) { s.queuedN = socketQueued(fd) }

// waitQueued blocks until the socket's receive queue holds n bytes (or its
// peer closed it, or it failed), or the read deadline passes: the socket's
// receive low-water mark is raised to n meanwhile, so that the poller does
// not wake the reader for fewer. Only where frameWaitSupported.
func (s *sock) waitQueued(n int) error {
	if err := s.setLowat(n); err != nil {
		return err
	}
	s.want, s.wantWait = n, false
	err := s.rc.Read(s.wantFn)
	if lerr := s.setLowat(1); err == nil {
		err = lerr // back to the default, for the reads of the frame
	}
	return err
}

// doWaitQueued asks to wait unless n bytes are queued already (they may
// have arrived before the low-water mark was raised, their wake-up
// spent); after the wait it reports ready.
func (s *sock) doWaitQueued(fd uintptr) bool {
	if s.wantWait {
		return true
	}
	if q := socketQueued(fd); q < 0 || q >= s.want {
		return true
	}
	s.wantWait = true
	return false
}

func (s *sock) setLowat(n int) error {
	s.lowatN, s.lowatErr = n, nil
	if err := s.rc.Control(s.lowatFn); err != nil {
		return err
	}
	return s.lowatErr
}

func (s *sock) doSetLowat(fd uintptr) { s.lowatErr = socketSetLowat(fd, s.lowatN) }
