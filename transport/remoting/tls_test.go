package remoting

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil/testcert"
)

func TestTLS(t *testing.T) {
	cert := testcert.New(t, "runnel test")
	srvCfg, cliCfg := cert.ServerTLS(), cert.ClientTLS()
	_, addr := newTestServer(t, WithTLSConfig(srvCfg))
	c := dialT(t, addr, WithTLSConfig(cliCfg))
	for i := range 5 {
		resp, err := c.Invoke(ctxT(t, 5*time.Second), echoReq(i))
		if err != nil {
			t.Fatal(err)
		}
		if err := checkEcho(resp, i); err != nil {
			t.Fatal(err)
		}
	}
	// A plain client on a TLS-only port gets nowhere.
	plain := dialT(t, addr, WithIdleTimeout(time.Second))
	if _, err := plain.Invoke(ctxT(t, 3*time.Second), echoReq(1)); err == nil {
		t.Fatal("plain request answered on a TLS port")
	}
}

func TestPermissiveTLS(t *testing.T) {
	cert := testcert.New(t, "runnel test")
	srvCfg, cliCfg := cert.ServerTLS(), cert.ClientTLS()
	_, addr := newTestServer(t, WithTLSConfig(srvCfg), WithPermissiveTLS())
	tc := dialT(t, addr, WithTLSConfig(cliCfg))
	pc := dialT(t, addr)
	for i := range 5 {
		for _, c := range []*Conn{tc, pc} {
			resp, err := c.Invoke(ctxT(t, 5*time.Second), echoReq(i))
			if err != nil {
				t.Fatal(err)
			}
			if err := checkEcho(resp, i); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A garbage TLS record is dropped, as a malformed frame would be.
	nc := rawDial(t, addr)
	if _, err := nc.Write([]byte{0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5}); err != nil {
		t.Fatal(err)
	}
	if err := nc.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(nc); err != nil && !isReset(err) {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatal("bad handshake left the connection open")
		}
	}
}
