package javatest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// recProxy is a recording TCP proxy for the RocketMQ remoting protocol: it
// forwards each connection to its target and records every frame in both
// directions, byte for byte. It rewrites one address in the bodies it
// forwards to clients (rewriteFrom → rewriteTo, of equal length), so that a
// name-server proxy can send clients to a broker proxy.
type recProxy struct {
	t      testing.TB
	ln     net.Listener
	target string
	Addr   string

	rewriteFrom, rewriteTo []byte // set before the proxy starts

	wg sync.WaitGroup
	mu struct {
		sync.Mutex
		frames []recFrame
		conns  []net.Conn
		closed bool
	}
}

// recFrame is one recorded frame: its bytes (length word included) and
// its decoded command.
type recFrame struct {
	Conn     int  // connection number, in accept order
	ToServer bool // client → target
	Raw      []byte
	Cmd      *protocol.Command
}

// startRecProxy listens on a loopback port with as many digits as
// samePortLen's port (so that addresses can be rewritten in place) and
// forwards to target, replacing rewrite[0] with rewrite[1] in what it
// forwards to clients (when given). It is closed at the end of the test.
func startRecProxy(t testing.TB, target, samePortLen string, rewrite ...string) *recProxy {
	t.Helper()
	_, want, _ := net.SplitHostPort(samePortLen)
	var ln net.Listener
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		if _, p, _ := net.SplitHostPort(l.Addr().String()); len(p) == len(want) {
			ln = l
			break
		}
		_ = l.Close()
	}
	if ln == nil {
		t.Fatalf("no loopback port with %d digits", len(want))
	}
	p := &recProxy{t: t, ln: ln, target: target, Addr: ln.Addr().String()}
	if len(rewrite) == 2 {
		p.rewriteFrom, p.rewriteTo = []byte(rewrite[0]), []byte(rewrite[1])
	}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Close stops accepting, closes every connection and joins the goroutines.
func (p *recProxy) Close() {
	p.mu.Lock()
	p.mu.closed = true
	conns := p.mu.conns
	p.mu.Unlock()
	_ = p.ln.Close()
	for _, c := range conns {
		_ = c.Close()
	}
	p.wg.Wait()
}

func (p *recProxy) accept() {
	defer p.wg.Done()
	for n := 0; ; n++ {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		if p.mu.closed {
			p.mu.Unlock()
			_ = c.Close()
			_ = s.Close()
			return
		}
		p.mu.conns = append(p.mu.conns, c, s)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pump(n, true, c, s)
		go p.pump(n, false, s, c)
	}
}

// pump copies frames from src to dst, recording each.
func (p *recProxy) pump(conn int, toServer bool, src, dst net.Conn) {
	defer p.wg.Done()
	defer func() { _ = dst.Close(); _ = src.Close() }()
	for {
		var lw [4]byte
		if _, err := io.ReadFull(src, lw[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(lw[:])
		if n < 4 || n > 64<<20 {
			return
		}
		raw := make([]byte, 4+n)
		copy(raw, lw[:])
		if _, err := io.ReadFull(src, raw[4:]); err != nil {
			return
		}
		if !toServer && len(p.rewriteFrom) > 0 {
			raw = bytes.ReplaceAll(raw, p.rewriteFrom, p.rewriteTo)
		}
		cmd, err := protocol.DecodeFrame(bytes.Clone(raw[4:]))
		if err != nil {
			p.t.Errorf("proxy: undecodable frame %x: %v", raw, err)
			return
		}
		p.mu.Lock()
		p.mu.frames = append(p.mu.frames, recFrame{Conn: conn, ToServer: toServer, Raw: raw, Cmd: cmd})
		p.mu.Unlock()
		if _, err := dst.Write(raw); err != nil {
			return
		}
	}
}

// Frames returns the frames recorded so far, in arrival order.
func (p *recProxy) Frames() []recFrame {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]recFrame(nil), p.mu.frames...)
}

// Requests returns the recorded requests with code (client → server, or
// with fromServer, server → client).
func (p *recProxy) Requests(code int32, fromServer bool) []recFrame {
	var out []recFrame
	for _, f := range p.Frames() {
		if !f.Cmd.IsResponse() && f.Cmd.Code == code && f.ToServer != fromServer {
			out = append(out, f)
		}
	}
	return out
}

// Response returns the response to req (same connection and opaque,
// the other direction), if one was recorded.
func (p *recProxy) Response(req recFrame) (recFrame, bool) {
	for _, f := range p.Frames() {
		if f.Conn == req.Conn && f.ToServer != req.ToServer && f.Cmd.IsResponse() && f.Cmd.Opaque == req.Cmd.Opaque {
			return f, true
		}
	}
	return recFrame{}, false
}

// recCluster is a name server proxy and a broker proxy in front of a Java
// cluster: routes through the name server proxy name the broker proxy.
type recCluster struct {
	NS, Broker *recProxy
}

func startRecCluster(t testing.TB, nsAddr, brokerAddr string) *recCluster {
	t.Helper()
	b := startRecProxy(t, brokerAddr, brokerAddr)
	if len(b.Addr) != len(brokerAddr) {
		t.Fatalf("proxy address %s and broker address %s differ in length", b.Addr, brokerAddr)
	}
	ns := startRecProxy(t, nsAddr, nsAddr, brokerAddr, b.Addr)
	return &recCluster{NS: ns, Broker: b}
}

// extKeys returns the ext field names of c, sorted.
func extKeys(c *protocol.Command) []string {
	keys := make([]string, 0, c.NumExt())
	for i := range c.NumExt() {
		keys = append(keys, c.ExtAt(i).Key)
	}
	slices.Sort(keys)
	return keys
}

func describe(f recFrame) string {
	c := f.Cmd
	dir := "client→server"
	if !f.ToServer {
		dir = "server→client"
	}
	kind := "request " + protocol.RequestCodeName(c.Code)
	if c.IsResponse() {
		kind = "response " + strconv.Itoa(int(c.Code))
	}
	st := "JSON"
	if c.SerializeType() == protocol.SerializeRocketMQ {
		st = "ROCKETMQ"
	}
	return fmt.Sprintf("conn %d %s %s %s lang %d v%d opaque %d flag %d ext %v body %d B", f.Conn, dir, kind, st,
		c.Language, c.Version, c.Opaque, c.Flag, extKeys(c), len(c.Body))
}
