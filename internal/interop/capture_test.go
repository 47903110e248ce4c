package interop

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// captured is one frame the official client sent to a captureServer.
type captured struct {
	raw []byte            // the frame exactly as received, length word included
	cmd *protocol.Command // runnel's decoding of a private copy of raw
}

// handlerFunc answers one decoded request; nil means "send nothing".
type handlerFunc func(req *protocol.Command) *protocol.Command

// captureServer is a TCP server on 127.0.0.1 that plays name server and
// broker for the official client. It reads frames with its own length-word
// loop (so the raw bytes are kept), decodes each with protocol.DecodeFrame,
// records it, and writes the handler's answer encoded by runnel's
// AppendFrame in the server's header encoding. Requests on one connection
// are handled in order. It is closed by t.Cleanup; every goroutine it starts
// is joined there.
type captureServer struct {
	t       testing.TB
	ln      net.Listener
	st      protocol.SerializeType
	handler handlerFunc
	wg      sync.WaitGroup
	mu      struct {
		sync.Mutex
		frames []captured
		conns  map[net.Conn]struct{}
		closed bool
	}
}

// newCaptureServer starts a server answering in header encoding st.
func newCaptureServer(t testing.TB, st protocol.SerializeType, h handlerFunc) *captureServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &captureServer{t: t, ln: ln, st: st, handler: h}
	s.mu.conns = make(map[net.Conn]struct{})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.acceptLoop()
	}()
	t.Cleanup(s.close)
	return s
}

// addr returns the "ip:port" the server listens on.
func (s *captureServer) addr() string { return s.ln.Addr().String() }

func (s *captureServer) close() {
	s.mu.Lock()
	s.mu.closed = true
	for c := range s.mu.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	_ = s.ln.Close()
	s.wg.Wait()
}

func (s *captureServer) acceptLoop() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return // closed
		}
		s.mu.Lock()
		if s.mu.closed {
			s.mu.Unlock()
			_ = c.Close()
			return
		}
		s.mu.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serve(c)
		}()
	}
}

// serve reads frames from c until it fails or closes.
func (s *captureServer) serve(c net.Conn) {
	defer func() {
		s.mu.Lock()
		delete(s.mu.conns, c)
		s.mu.Unlock()
		_ = c.Close()
	}()
	for {
		raw, err := readRawFrame(c)
		if err != nil {
			s.mu.Lock()
			closed := s.mu.closed
			s.mu.Unlock()
			if !closed && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.t.Errorf("capture server: reading a frame: %v", err)
			}
			return
		}
		// DecodeFrame aliases (and may unescape in place) its input: give it
		// a copy so raw stays exactly what was received.
		cmd, err := protocol.DecodeFrame(bytes.Clone(raw[4:]))
		if err != nil {
			s.t.Errorf("capture server: runnel cannot decode a frame of the official client: %v\n% x", err, raw)
			return
		}
		s.mu.Lock()
		s.mu.frames = append(s.mu.frames, captured{raw: raw, cmd: cmd})
		s.mu.Unlock()
		resp := s.handler(cmd)
		if resp == nil {
			continue
		}
		if resp.Version == 0 {
			resp.Language, resp.Version = protocol.LanguageJava, protocol.CurrentVersion
		}
		out, err := resp.AppendFrame(nil, s.st)
		if err != nil {
			s.t.Errorf("capture server: encoding the response to code %d: %v", cmd.Code, err)
			return
		}
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

// readRawFrame reads one frame, length word included, bounded by the
// protocol's default maximum.
func readRawFrame(r io.Reader) ([]byte, error) {
	var word [4]byte
	if _, err := io.ReadFull(r, word[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(word[:])
	if n < 4 || n > protocol.DefaultMaxFrameSize {
		return nil, fmt.Errorf("frame length %d out of range", n)
	}
	raw := make([]byte, 4+n)
	copy(raw, word[:])
	if _, err := io.ReadFull(r, raw[4:]); err != nil {
		return nil, err
	}
	return raw, nil
}

// frames returns the frames received so far with the given request code.
func (s *captureServer) frames(code int32) []captured {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []captured
	for _, f := range s.mu.frames {
		if f.cmd.Code == code && !f.cmd.IsResponse() {
			out = append(out, f)
		}
	}
	return out
}

// waitFrames polls until at least n frames with code arrived, or fails the
// test after the deadline.
func (s *captureServer) waitFrames(t testing.TB, code int32, n int, within time.Duration) []captured {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if f := s.frames(code); len(f) >= n {
			return f
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %d frame(s) with code %d within %v (got %d)", n, code, within, len(s.frames(code)))
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline, not synchronisation by sleep
	}
}
