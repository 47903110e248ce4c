package testcert

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"testing"
	"time"
)

// handshake runs a TLS handshake between srv and cli over loopback TCP
// and returns the client's and the server's error.
func handshake(t *testing.T, srv, cli *tls.Config) (clientErr, serverErr error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		s := tls.Server(conn, srv)
		err = s.Handshake()
		if err == nil {
			// A byte from the client proves it accepted the server too.
			_, err = s.Read(make([]byte, 1))
		}
		done <- err
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	c := tls.Client(conn, cli)
	clientErr = c.Handshake()
	if clientErr == nil {
		_, clientErr = c.Write([]byte{1})
	}
	_ = conn.Close()
	return clientErr, <-done
}

func TestServerAndClient(t *testing.T) {
	c := New(t, "srv")
	if cerr, serr := handshake(t, c.ServerTLS(), c.ClientTLS()); cerr != nil || serr != nil {
		t.Fatalf("handshake with the certificate's own CA: client %v, server %v", cerr, serr)
	}
	if cerr, _ := handshake(t, c.ServerTLS(), New(t, "other").ClientTLS()); cerr == nil {
		t.Fatal("a client trusting another CA accepted the certificate")
	}
}

func TestClientCertificate(t *testing.T) {
	srv, cli := New(t, "srv"), New(t, "cli")
	sc := srv.ServerTLS()
	sc.ClientCAs, sc.ClientAuth = cli.Pool, tls.RequireAndVerifyClientCert
	cc := srv.ClientTLS()
	cc.Certificates = []tls.Certificate{cli.Certificate}
	if cerr, serr := handshake(t, sc, cc); cerr != nil || serr != nil {
		t.Fatalf("handshake with a client certificate: client %v, server %v", cerr, serr)
	}
	cc.Certificates = []tls.Certificate{New(t, "stranger").Certificate}
	if _, serr := handshake(t, sc, cc); serr == nil {
		t.Fatal("the server accepted a client certificate of another CA")
	}
}

func TestWriteFiles(t *testing.T) {
	c := New(t, "srv")
	f := c.WriteFiles(t, t.TempDir())
	pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := leaf.VerifyHostname("127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(f.CA)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatal("CA file holds no PEM block")
	}
	ca, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if !ca.IsCA || ca.Subject.CommonName != "srv CA" {
		t.Fatalf("CA file: IsCA %v, CN %q", ca.IsCA, ca.Subject.CommonName)
	}
	if err := leaf.CheckSignatureFrom(ca); err != nil {
		t.Fatalf("certificate not signed by the CA file's certificate: %v", err)
	}
}
