package remoting

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// rawRoundTrip writes req with st headers on nc and reads the answer's
// frame (see readRawFrame).
func rawRoundTrip(t *testing.T, nc net.Conn, br *bufio.Reader, req *protocol.Command, st protocol.SerializeType) (protocol.SerializeType, *protocol.Command) {
	t.Helper()
	f, err := req.AppendFrame(nil, st)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Write(f); err != nil {
		t.Fatal(err)
	}
	return readRawFrame(t, nc, br)
}

// readRawFrame reads one whole frame from br (within 10 s of nc's deadline)
// and returns its serialize-type byte and the decoded command.
func readRawFrame(t *testing.T, nc net.Conn, br *bufio.Reader) (protocol.SerializeType, *protocol.Command) {
	t.Helper()
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	var lw [4]byte
	if _, err := io.ReadFull(br, lw[:]); err != nil {
		t.Fatalf("read length: %v", err)
	}
	n := int(lw[0])<<24 | int(lw[1])<<16 | int(lw[2])<<8 | int(lw[3])
	buf := make([]byte, n)
	if _, err := io.ReadFull(br, buf); err != nil {
		t.Fatalf("read frame: %v", err)
	}
	st := protocol.SerializeType(buf[0])
	cmd, err := protocol.DecodeFrame(buf)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	if cmd.SerializeType() != st {
		t.Fatalf("decoded SerializeType %d, frame says %d", cmd.SerializeType(), st)
	}
	return st, cmd
}

// TestResponseFollowsRequestEncoding: a Server without WithSerializeType
// answers each request in the header encoding it came in, frame by frame on
// one connection, as either kind of RocketMQ peer may send; one given
// WithSerializeType answers everything in that encoding, as a Java server
// configured with rocketmq.serialize.type does.
func TestResponseFollowsRequestEncoding(t *testing.T) {
	for _, fixed := range []struct {
		name string
		opts []ServerOption
		want func(req protocol.SerializeType) protocol.SerializeType
	}{
		{"default", nil, func(req protocol.SerializeType) protocol.SerializeType { return req }},
		{"fixedJSON", []ServerOption{WithSerializeType(protocol.SerializeJSON)},
			func(protocol.SerializeType) protocol.SerializeType { return protocol.SerializeJSON }},
		{"fixedRocketMQ", []ServerOption{WithSerializeType(protocol.SerializeRocketMQ)},
			func(protocol.SerializeType) protocol.SerializeType { return protocol.SerializeRocketMQ }},
	} {
		t.Run(fixed.name, func(t *testing.T) {
			_, addr := newTestServer(t, fixed.opts...)
			nc := rawDial(t, addr)
			br := bufio.NewReader(nc)
			order := []protocol.SerializeType{
				protocol.SerializeRocketMQ, protocol.SerializeJSON, protocol.SerializeRocketMQ,
				protocol.SerializeRocketMQ, protocol.SerializeJSON,
			}
			for i, st := range order {
				req := echoReq(i)
				req.Opaque = int32(i + 1)
				req.Language, req.Version = protocol.LanguageJava, protocol.CurrentVersion
				got, resp := rawRoundTrip(t, nc, br, req, st)
				if want := fixed.want(st); got != want {
					t.Fatalf("request %d in type %d answered in type %d, want %d", i, st, got, want)
				}
				if err := checkEcho(resp, i); err != nil {
					t.Fatal(err)
				}
				if resp.Opaque != req.Opaque {
					t.Fatalf("opaque %d, want %d", resp.Opaque, req.Opaque)
				}
			}
		})
	}
}

// TestSystemErrorFollowsRequestEncoding: the SYSTEM_ERROR answering a
// failed processor goes out in the request's encoding too.
func TestSystemErrorFollowsRequestEncoding(t *testing.T) {
	_, addr := newTestServer(t)
	nc := rawDial(t, addr)
	br := bufio.NewReader(nc)
	for i, st := range []protocol.SerializeType{protocol.SerializeRocketMQ, protocol.SerializeJSON} {
		req := protocol.NewRequest(codeErr)
		req.Opaque = int32(i + 1)
		got, resp := rawRoundTrip(t, nc, br, req, st)
		if got != st || resp.Code != protocol.ResSystemError || resp.Remark != fmt.Sprintf("boom %d", i+1) {
			t.Fatalf("type %d: answered type %d code %d remark %q", st, got, resp.Code, resp.Remark)
		}
	}
}

// TestBinaryFallsBackToJSON: a Conn writing binary headers sends a request
// whose code does not fit the binary header's int16 (POP_MESSAGE's 200050)
// in JSON instead of failing; its peer, answering in the request's
// encoding, answers in JSON.
func TestBinaryFallsBackToJSON(t *testing.T) {
	s, addr := newTestServer(t)
	const popCode = 200050
	seen := make(chan protocol.SerializeType, 2)
	for _, code := range []int32{popCode, 201} {
		s.Handle(code, ProcessorFunc(func(ctx context.Context, rc *RequestCtx) (*protocol.Command, error) {
			seen <- rc.Request().SerializeType()
			return protocol.NewResponse(rc.Request(), 0, ""), nil
		}))
	}
	c := dialT(t, addr, WithSerializeType(protocol.SerializeRocketMQ))
	for _, tc := range []struct {
		code int32
		want protocol.SerializeType
	}{{popCode, protocol.SerializeJSON}, {201, protocol.SerializeRocketMQ}} {
		resp, err := c.Invoke(ctxT(t, 5*time.Second), protocol.NewRequest(tc.code))
		if err != nil {
			t.Fatalf("code %d: %v", tc.code, err)
		}
		if got := <-seen; got != tc.want {
			t.Fatalf("code %d sent in type %d, want %d", tc.code, got, tc.want)
		}
		if resp.Code != 0 || resp.SerializeType() != tc.want {
			t.Fatalf("code %d: response code %d in type %d, want type %d", tc.code, resp.Code, resp.SerializeType(), tc.want)
		}
	}
}

// TestClientAnswersInRequestEncoding: a client Conn answers a request its
// server sends it (CHECK_TRANSACTION_STATE and the like) in that request's
// encoding unless WithSerializeType fixed its own.
func TestClientAnswersInRequestEncoding(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    []Option
		reqType protocol.SerializeType
		want    protocol.SerializeType
	}{
		{"default/json", nil, protocol.SerializeJSON, protocol.SerializeJSON},
		{"default/rocketmq", nil, protocol.SerializeRocketMQ, protocol.SerializeRocketMQ},
		{"fixedRocketMQ/json", []Option{WithSerializeType(protocol.SerializeRocketMQ)}, protocol.SerializeJSON, protocol.SerializeRocketMQ},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := rawListen(t)
			type accepted struct {
				nc  net.Conn
				err error
			}
			ac := make(chan accepted, 1)
			go func() {
				nc, err := l.Accept()
				ac <- accepted{nc, err}
			}()
			opts := append([]Option{WithRequestHandler(func(ctx context.Context, _ *Conn, req *protocol.Command) *protocol.Command {
				return echoResponse(req)
			})}, tc.opts...)
			dialT(t, l.Addr().String(), opts...)
			a := <-ac
			if a.err != nil {
				t.Fatal(a.err)
			}
			t.Cleanup(func() { a.nc.Close() })
			req := echoReq(7)
			req.Opaque = 99
			f, err := req.AppendFrame(nil, tc.reqType)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := a.nc.Write(f); err != nil {
				t.Fatal(err)
			}
			got, resp := readRawFrame(t, a.nc, bufio.NewReader(a.nc))
			if got != tc.want {
				t.Fatalf("answered in type %d, want %d", got, tc.want)
			}
			if err := checkEcho(resp, 7); err != nil || resp.Opaque != 99 {
				t.Fatalf("response %+v: %v", resp, err)
			}
		})
	}
}
