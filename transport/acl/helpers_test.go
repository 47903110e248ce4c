package acl_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/runnel-dev/runnel/internal/testutil/testcert"
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

// serverCert makes a throw-away CA and a certificate for 127.0.0.1 signed
// by it, writes them as PEM files and loads those with acl.ServerTLSConfig
// (no client CA). The certificate's ClientTLS trusts the server.
func serverCert(t testing.TB, name string) (*tls.Config, *testcert.Cert) {
	t.Helper()
	c := testcert.New(t, name)
	f := c.WriteFiles(t, t.TempDir())
	srvTLS, err := acl.ServerTLSConfig(f.Cert, f.Key, "")
	if err != nil {
		t.Fatal(err)
	}
	return srvTLS, c
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
