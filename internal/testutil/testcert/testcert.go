// Package testcert makes throw-away TLS certificates for tests: a fresh CA
// and a certificate for 127.0.0.1 signed by it, usable as server and as
// client certificate, valid from an hour ago to an hour from now. It
// depends on the standard library only, so any package's tests may import
// it without an import cycle.
package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Cert is a certificate for 127.0.0.1 and the CA that signed it.
type Cert struct {
	// Name is the certificate's common name; the CA's is Name + " CA".
	Name string
	// Certificate is the leaf with its private key (Leaf set).
	Certificate tls.Certificate
	// Pool trusts the CA (and so the leaf).
	Pool *x509.CertPool

	caDER, keyDER []byte
}

// New returns a fresh CA and a certificate named name for IP 127.0.0.1
// signed by it, with extended key usages server and client
// authentication. It fails t on any error.
func New(t testing.TB, name string) *Cert {
	t.Helper()
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name + " CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &Cert{
		Name:        name,
		Certificate: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf},
		Pool:        pool,
		caDER:       caDER,
		keyDER:      keyDER,
	}
}

// ServerTLS returns a server configuration presenting the certificate
// (TLS 1.2 at least, no client certificate asked for).
func (c *Cert) ServerTLS() *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{c.Certificate}, MinVersion: tls.VersionTLS12}
}

// ClientTLS returns a client configuration trusting the CA and expecting
// server name 127.0.0.1 (TLS 1.2 at least, no client certificate).
func (c *Cert) ClientTLS() *tls.Config {
	return &tls.Config{RootCAs: c.Pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
}

// Files are the paths of PEM files written by WriteFiles.
type Files struct {
	CA   string // the CA's certificate
	Cert string // the certificate
	Key  string // the certificate's EC private key
}

// WriteFiles writes the CA certificate, the certificate and its key as PEM
// files <Name>-ca.pem, <Name>.pem and <Name>-key.pem (mode 0600) into dir
// and returns their paths. It fails t on any error.
func (c *Cert) WriteFiles(t testing.TB, dir string) Files {
	t.Helper()
	f := Files{
		CA:   filepath.Join(dir, c.Name+"-ca.pem"),
		Cert: filepath.Join(dir, c.Name+".pem"),
		Key:  filepath.Join(dir, c.Name+"-key.pem"),
	}
	for _, w := range []struct {
		path string
		blk  pem.Block
	}{
		{f.CA, pem.Block{Type: "CERTIFICATE", Bytes: c.caDER}},
		{f.Cert, pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate.Certificate[0]}},
		{f.Key, pem.Block{Type: "EC PRIVATE KEY", Bytes: c.keyDER}},
	} {
		if err := os.WriteFile(w.path, pem.EncodeToMemory(&w.blk), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return f
}
