package remoting

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"math/big"
	"net"
	"testing"
	"time"
)

// testTLS returns a server config with a fresh self-signed certificate for
// 127.0.0.1 and a client config trusting it.
func testTLS(t testing.TB) (server, client *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "runnel test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	server = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	client = &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}
	return server, client
}

func TestTLS(t *testing.T) {
	srvCfg, cliCfg := testTLS(t)
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
	srvCfg, cliCfg := testTLS(t)
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
