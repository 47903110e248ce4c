package acl_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/runnel-dev/runnel/transport/acl"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Resources the matrix uses: identities get permissions on these.
const (
	topicT = "T"
	groupG = "G"
)

// testConfig is the ACL configuration of the matrix: one account per
// identity.
func testConfig() *acl.Config {
	return &acl.Config{Accounts: []acl.Account{
		{AccessKey: "admin-ak", SecretKey: "admin-secret", Admin: true},
		{AccessKey: "user-ak", SecretKey: "user-secret", DefaultTopicPerm: "PUB|SUB", DefaultGroupPerm: "SUB"},
		{AccessKey: "pub-only", SecretKey: "pub-secret", DefaultTopicPerm: "PUB", DefaultGroupPerm: "DENY"},
		{AccessKey: "sub-only", SecretKey: "sub-secret", DefaultTopicPerm: "DENY", DefaultGroupPerm: "DENY",
			TopicPerms: map[string]string{topicT: "SUB"}, GroupPerms: map[string]string{groupG: "SUB"}},
		// Generous defaults, explicit DENY on the resources used: DENY wins.
		{AccessKey: "deny-ak", SecretKey: "deny-secret", DefaultTopicPerm: "PUB|SUB", DefaultGroupPerm: "SUB",
			TopicPerms: map[string]string{topicT: "DENY"}, GroupPerms: map[string]string{groupG: "DENY"}},
	}}
}

// writeJSON writes v as JSON to a file in dir and returns its path.
func writeJSON(t testing.TB, dir, name string, v any) string {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// certFiles holds PEM files of a throw-away CA and a certificate it signed.
type certFiles struct {
	caFile, certFile, keyFile string
	pool                      *x509.CertPool
}

// newCert writes a CA and a certificate for 127.0.0.1 signed by it (usable
// as server and client certificate) into dir.
func newCert(t testing.TB, dir, name string) certFiles {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name + " CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	f := certFiles{
		caFile:   filepath.Join(dir, name+"-ca.pem"),
		certFile: filepath.Join(dir, name+".pem"),
		keyFile:  filepath.Join(dir, name+"-key.pem"),
		pool:     x509.NewCertPool(),
	}
	f.pool.AddCert(caCert)
	for path, blk := range map[string]*pem.Block{
		f.caFile:   {Type: "CERTIFICATE", Bytes: caDER},
		f.certFile: {Type: "CERTIFICATE", Bytes: der},
		f.keyFile:  {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(path, pem.EncodeToMemory(blk), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// clientTLS returns a client configuration trusting f's CA.
func (f certFiles) clientTLS() *tls.Config {
	return &tls.Config{RootCAs: f.pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
