package interop

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// tamperProxy forwards TCP connections to a broker and, while tamper is
// set, flips one byte of the body of every SEND_MESSAGE(_V2) request on its
// way: a body altered after the client signed it. Frames are forwarded
// whole, one by one, in both directions.
type tamperProxy struct {
	ln       net.Listener
	target   atomic.Pointer[string]
	tamper   atomic.Bool
	tampered atomic.Int64
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
}

func startTamperProxy(tb testing.TB) *tamperProxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &tamperProxy{ln: ln}
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(p.close)
	return p
}

func (p *tamperProxy) addr() string { return p.ln.Addr().String() }

func (p *tamperProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		target := p.target.Load()
		if target == nil {
			_ = c.Close()
			continue
		}
		up, err := net.Dial("tcp", *target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(up, c, true)
		go p.pipe(c, up, false)
	}
}

// pipe copies frames from src to dst; requests (client to broker) may be
// tampered with. Either side closing closes both.
func (p *tamperProxy) pipe(dst, src net.Conn, requests bool) {
	defer p.wg.Done()
	defer dst.Close()
	defer src.Close()
	var lenBuf [4]byte
	for {
		if _, err := io.ReadFull(src, lenBuf[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(lenBuf[:])
		if n < 4 || n > 16<<20 {
			return
		}
		frame := make([]byte, 4+n)
		copy(frame, lenBuf[:])
		if _, err := io.ReadFull(src, frame[4:]); err != nil {
			return
		}
		if requests && p.tamper.Load() {
			p.maybeTamper(frame)
		}
		if _, err := dst.Write(frame); err != nil {
			return
		}
	}
}

// maybeTamper flips the last body byte of a JSON-headed SEND_MESSAGE or
// SEND_MESSAGE_V2 request (the official Go client's header encoding).
func (p *tamperProxy) maybeTamper(frame []byte) {
	word := binary.BigEndian.Uint32(frame[4:8])
	if word>>24 != 0 { // not JSON
		return
	}
	hlen := int(word & 0xFFFFFF)
	if 8+hlen > len(frame) {
		return
	}
	var h struct {
		Code int `json:"code"`
	}
	if err := json.Unmarshal(frame[8:8+hlen], &h); err != nil {
		return
	}
	body := frame[8+hlen:]
	if (h.Code != int(protocol.ReqSendMessage) && h.Code != int(protocol.ReqSendMessageV2)) || len(body) == 0 {
		return
	}
	body[len(body)-1] ^= 0x01
	p.tampered.Add(1)
}

func (p *tamperProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// TestACLOfficialProducerAlteredBody: the official producer with the right
// credentials sends through a proxy (the broker advertises the proxy's
// address) that alters the body of its SEND requests after the client
// signed them: the broker answers NO_PERMISSION (the client reports
// "CODE: 16") and stores nothing. The same producer through the same proxy,
// not tampering, sends: the refusal comes from the altered body alone.
func TestACLOfficialProducerAlteredBody(t *testing.T) {
	px := startTamperProxy(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	env := startACLInteropEnv(t, false, broker.WithAdvertisedAddr(px.addr()))
	// The proxy forwards to the broker's real port, known once it listens.
	real := env.b.Addr()
	px.target.Store(&real)
	pol := env.policy
	topic := uniqueName("AclTamper")
	env.createTopicSigned(t, topic)

	p := newACLProducer(t, env.nsAddr, &primitive.Credentials{AccessKey: aclInteropApp.AccessKey, SecretKey: aclInteropApp.SecretKey})
	if _, err := p.SendSync(ctx, primitive.NewMessage(topic, []byte("intact body"))); err != nil {
		t.Fatalf("send through the proxy, not tampering: %v", err)
	}
	if n := env.maxOffsetSigned(t, topic); n != 1 {
		t.Fatalf("%d messages stored, want 1", n)
	}

	px.tamper.Store(true)
	denied0 := pol.Stats().Denied
	res, err := p.SendSync(ctx, primitive.NewMessage(topic, []byte("body altered after signing")))
	if err == nil {
		t.Fatalf("send with an altered body accepted: %+v", res)
	}
	if px.tampered.Load() == 0 {
		t.Fatal("the proxy altered no SEND request")
	}
	if !strings.Contains(err.Error(), "CODE: 16") || !strings.Contains(err.Error(), "acl: ") {
		t.Fatalf("send error %q, want NO_PERMISSION (16) from the ACL", err)
	}
	if n := env.maxOffsetSigned(t, topic); n != 1 {
		t.Fatalf("%d messages stored after the altered send, want 1", n)
	}
	if d := pol.Stats().Denied - denied0; d < 1 {
		t.Fatalf("no denial counted for the altered send")
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("test ran out of time")
	}
}
