package acl_test

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runnel-dev/runnel/transport/acl"
	"github.com/runnel-dev/runnel/transport/protocol"
)

func TestParseConfigErrors(t *testing.T) {
	const ok = `{"accessKey":"account1","secretKey":"secret-1"}`
	cases := []struct {
		name string
		json string
		want []string // substrings of the error
	}{
		{"not JSON", `{"accounts": [`, []string{"the JSON ends early"}},
		{"syntax error position", "{\n  \"accounts\": [}\n}", []string{"line 2 column"}},
		{"unknown key", `{"acounts": []}`, []string{`unknown field "acounts"`}},
		{"trailing data", `{"accounts":[` + ok + `]} {}`, []string{"data after the top-level object"}},
		{"empty file", ``, []string{"the JSON ends early"}},
		{"no accounts", `{}`, []string{"accounts: required"}},
		{"empty accounts", `{"accounts":[]}`, []string{"accounts: needs at least 1"}},
		{"missing keys", `{"accounts":[{}]}`, []string{"accounts[0].accessKey: required", "accounts[0].secretKey: required"}},
		{"short keys", `{"accounts":[{"accessKey":"ak","secretKey":"sk"}]}`,
			[]string{"accounts[0].accessKey: must be at least 6", "accounts[0].secretKey: must be at least 6"}},
		{"space in access key", `{"accounts":[{"accessKey":"my key1","secretKey":"secret-1"}]}`,
			[]string{"accounts[0].accessKey: only printable ASCII"}},
		{"bad default perm", `{"accounts":[{"accessKey":"account1","secretKey":"secret-1","defaultTopicPerm":"WRITE"}]}`,
			[]string{`accounts[0].defaultTopicPerm: permission "WRITE"`}},
		{"bad topic perm", `{"accounts":[{"accessKey":"account1","secretKey":"secret-1","topicPerms":{"T":"ALL"}}]}`,
			[]string{`accounts[0].topicPerms[T]: permission "ALL"`}},
		{"empty group perm", `{"accounts":[{"accessKey":"account1","secretKey":"secret-1","groupPerms":{"G":""}}]}`,
			[]string{`accounts[0].groupPerms[G]: required`}},
		{"bad topic name", `{"accounts":[{"accessKey":"account1","secretKey":"secret-1","topicPerms":{"a b":"PUB"}}]}`,
			[]string{"accounts[0].topicPerms[a b]: a topic name has only"}},
		{"retry topic in topicPerms", `{"accounts":[{"accessKey":"account1","secretKey":"secret-1","topicPerms":{"%RETRY%G":"SUB"}}]}`,
			[]string{"set groupPerms[G]"}},
		{"duplicate access key", `{"accounts":[` + ok + `,` + ok + `]}`, []string{`accounts[1].accessKey: "account1" is also used by accounts[0]`}},
		{"secret equals access key", `{"accounts":[{"accessKey":"account1","secretKey":"account1"}]}`,
			[]string{"accounts[0].secretKey: must differ"}},
		{"bad CIDR", `{"allowCIDRs":["10.0.0.1"],"accounts":[` + ok + `]}`, []string{`allowCIDRs[0]: "10.0.0.1" is not a CIDR prefix`}},
		{"CIDR host bits", `{"allowCIDRs":["10.1.2.3/8"],"accounts":[` + ok + `]}`, []string{"did you mean 10.0.0.0/8"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := acl.ParseConfig([]byte(tc.json))
			if err == nil {
				t.Fatalf("accepted: %+v", cfg)
			}
			if !errors.Is(err, acl.ErrInvalidConfig) {
				t.Errorf("error does not wrap ErrInvalidConfig: %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not mention %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "secret-1") {
				t.Errorf("error reveals a secret key: %v", err)
			}
		})
	}
}

func TestParseConfigValid(t *testing.T) {
	cfg, err := acl.ParseConfig([]byte(`{
	  "allowCIDRs": ["127.0.0.0/8", "::1/128"],
	  "acceptUnsignedSecurityToken": true,
	  "accounts": [
	    {"accessKey": "admin-ak", "secretKey": "admin-secret", "admin": true},
	    {"accessKey": "app-ak-1", "secretKey": "app-secret", "defaultTopicPerm": "sub | pub", "defaultGroupPerm": "SUB",
	     "topicPerms": {"orders": "PUB", "%DLQ%G": "DENY"}, "groupPerms": {"billing": "DENY"}}
	  ]}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Accounts) != 2 || !cfg.AcceptUnsignedSecurityToken || len(cfg.AllowCIDRs) != 2 {
		t.Fatalf("parsed %+v", cfg)
	}
	if _, err := acl.NewPolicy(cfg); err != nil {
		t.Fatal(err)
	}
}

func TestLoadConfigFileErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := acl.LoadConfig(filepath.Join(dir, "missing.json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	big := filepath.Join(dir, "big.json")
	if err := os.WriteFile(big, make([]byte, acl.MaxConfigSize+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := acl.LoadConfig(big); !errors.Is(err, acl.ErrInvalidConfig) || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("big file: %v", err)
	}
	bad := writeJSON(t, dir, "bad.json", map[string]any{"accounts": []any{}})
	if _, err := acl.LoadConfig(bad); err == nil || !strings.Contains(err.Error(), bad) {
		t.Fatalf("error does not name the file: %v", err)
	}
	if _, err := acl.NewPolicy(nil); !errors.Is(err, acl.ErrInvalidConfig) {
		t.Fatalf("nil config: %v", err)
	}
	p, err := acl.NewPolicy(testConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Reload(); !errors.Is(err, acl.ErrNoFile) {
		t.Fatalf("Reload without a file: %v", err)
	}
}

// TestReload changes the file under a running policy: a valid change takes
// effect, an invalid one is refused and the previous configuration stays.
func TestReload(t *testing.T) {
	dir := t.TempDir()
	cfg := &acl.Config{Accounts: []acl.Account{{AccessKey: "account1", SecretKey: "secret-one", DefaultTopicPerm: "PUB"}}}
	path := writeJSON(t, dir, "acl.json", cfg)
	p, err := acl.LoadPolicy(path)
	if err != nil {
		t.Fatal(err)
	}
	remote := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9}
	send := func(cr acl.Credentials) error {
		cmd := protocol.NewRequest(protocol.ReqSendMessage)
		cmd.SetExt("topic", "T")
		acl.Sign(cmd, cr)
		return p.Check(cmd, remote)
	}
	one := acl.Credentials{AccessKey: "account1", SecretKey: "secret-one"}
	two := acl.Credentials{AccessKey: "account2", SecretKey: "secret-two"}
	if err := send(one); err != nil {
		t.Fatal(err)
	}
	if err := send(two); err == nil || !strings.Contains(err.Error(), `unknown AccessKey "account2"`) {
		t.Fatalf("account2 before reload: %v", err)
	}

	// account1 loses PUB, account2 appears, and the allow-list excludes nobody here.
	cfg.Accounts[0].DefaultTopicPerm = "SUB"
	cfg.Accounts = append(cfg.Accounts, acl.Account{AccessKey: "account2", SecretKey: "secret-two", DefaultTopicPerm: "PUB"})
	cfg.AllowCIDRs = []string{"127.0.0.0/8"}
	writeJSON(t, dir, "acl.json", cfg)
	if err := p.Reload(); err != nil {
		t.Fatal(err)
	}
	if err := send(one); err == nil || !strings.Contains(err.Error(), `lacks PUB on topic "T"`) {
		t.Fatalf("account1 after reload: %v", err)
	}
	if err := send(two); err != nil {
		t.Fatalf("account2 after reload: %v", err)
	}

	// An invalid file is refused; the last good configuration stays.
	if err := os.WriteFile(path, []byte(`{"accounts":[{"accessKey":"account2","secretKey":"x"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.Reload(); !errors.Is(err, acl.ErrInvalidConfig) {
		t.Fatalf("invalid reload: %v", err)
	}
	if err := send(two); err != nil {
		t.Fatalf("account2 after a failed reload: %v", err)
	}
	// The allow-list from the reload applies.
	if err := p.Check(signedSend(two), &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 9}); err == nil ||
		!strings.Contains(err.Error(), "not in the allow-list") {
		t.Fatalf("outside the allow-list: %v", err)
	}
	if st := p.Stats(); st.Allowed != 3 || st.Denied != 3 {
		t.Fatalf("stats %+v", st)
	}
}

func signedSend(cr acl.Credentials) *protocol.Command {
	cmd := protocol.NewRequest(protocol.ReqSendMessage)
	cmd.SetExt("topic", "T")
	acl.Sign(cmd, cr)
	return cmd
}

func TestParsePerm(t *testing.T) {
	for s, want := range map[string]acl.Perm{"PUB": acl.PermPub, "sub": acl.PermSub, "PUB|SUB": acl.PermPubSub,
		"SUB | PUB": acl.PermPubSub, "DENY": acl.PermDeny} {
		got, err := acl.ParsePerm(s)
		if err != nil || got != want {
			t.Errorf("ParsePerm(%q) = %v, %v", s, got, err)
		}
		if again, _ := acl.ParsePerm(got.String()); again != got {
			t.Errorf("%v does not round-trip", got)
		}
	}
	for _, s := range []string{"", "PUBSUB", "ADMIN", "PUB|"} {
		if _, err := acl.ParsePerm(s); err == nil {
			t.Errorf("ParsePerm(%q) accepted", s)
		}
	}
	if acl.PermDeny.Allows(acl.PermDeny) || !acl.PermPubSub.Allows(acl.PermSub) || acl.PermPub.Allows(acl.PermSub) {
		t.Error("Allows")
	}
}
