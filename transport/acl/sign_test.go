package acl_test

import (
	"net"
	"strings"
	"testing"

	"github.com/runnel-dev/runnel/transport/acl"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// Expected signatures were computed independently with Python's hmac and
// base64 modules: base64(HMAC-SHA1(secret, content)). transport/client's
// signer is checked against the same vectors (its acl_test.go).
func TestSignatureVectors(t *testing.T) {
	cases := []struct {
		name    string
		ext     [][2]string
		body    []byte
		version int32
		cr      acl.Credentials
		content string // what is signed, for the reader
		want    string
	}{
		{name: "protocol §8 example", ext: [][2]string{{"topic", "T"}},
			cr: acl.Credentials{AccessKey: "ak", SecretKey: "sk"}, content: "akT", want: "vX6jW2Q9g11lvMjNC+gReuZ8fTQ="},
		{name: "security token signed", ext: [][2]string{{"topic", "T"}},
			cr: acl.Credentials{AccessKey: "ak", SecretKey: "sk", SecurityToken: "tok"}, content: "aktokT", want: "lBJAxv3ke6xvagX3v2rETxrIBbQ="},
		{name: "body appended raw", ext: [][2]string{{"topic", "T"}}, body: []byte("\x00\x01\x02body"),
			cr: acl.Credentials{AccessKey: "ak", SecretKey: "sk"}, content: `akT\x00\x01\x02body`, want: "slPpg7mzeA3fTwWdBFkO+fcl09A="},
		{name: "stale signature excluded", ext: [][2]string{{"Signature", "old"}, {"topic", "T"}},
			cr: acl.Credentials{AccessKey: "ak", SecretKey: "sk"}, content: "akT", want: "vX6jW2Q9g11lvMjNC+gReuZ8fTQ="},
		{name: "_UNIQUE_KEY_QUERY signed for new clients", ext: [][2]string{{"topic", "T"}, {"_UNIQUE_KEY_QUERY", "true"}},
			version: 400, cr: acl.Credentials{AccessKey: "ak", SecretKey: "sk"}, content: "aktrueT", want: "61INrPr16f5hs9UHLHMFWV/59p4="},
		{name: "_UNIQUE_KEY_QUERY excluded up to V4_9_3", ext: [][2]string{{"topic", "T"}, {"_UNIQUE_KEY_QUERY", "true"}},
			version: 399, cr: acl.Credentials{AccessKey: "ak", SecretKey: "sk"}, content: "akT", want: "vX6jW2Q9g11lvMjNC+gReuZ8fTQ="},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cmd := protocol.NewRequest(protocol.ReqSendMessage)
			cmd.Version = tc.version
			for _, kv := range tc.ext {
				cmd.SetExt(kv[0], kv[1])
			}
			cmd.Body = tc.body
			acl.Sign(cmd, tc.cr)
			if got, _ := cmd.Ext(acl.KeySignature); got != tc.want {
				t.Fatalf("Sign over %q = %q, want %q", tc.content, got, tc.want)
			}
			if got := acl.Signature(cmd, tc.cr.SecretKey); got != tc.want {
				t.Fatalf("Signature = %q, want %q", got, tc.want)
			}
			acl.Sign(cmd, tc.cr) // re-signing a signed command changes nothing
			if got, _ := cmd.Ext(acl.KeySignature); got != tc.want {
				t.Fatalf("re-signed = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestRepeatedKeyLastWins checks that a header repeating a key is signed
// with the last value, the one Command.Ext (and so authorization) sees:
// signing "T1" and authorising "T2" is impossible.
func TestRepeatedKeyLastWins(t *testing.T) {
	frame := []byte(`{"code":10,"flag":0,"language":"GO","opaque":1,"serializeTypeCurrentRPC":"JSON","version":400,` +
		`"extFields":{"AccessKey":"ak","topic":"T1","topic":"T2"}}`)
	cmd, err := protocol.DecodeFrame(lengthPrefixed(frame))
	if err != nil {
		t.Skipf("the JSON decoder refuses repeated keys (%v): nothing to check", err)
	}
	if v, _ := cmd.Ext("topic"); v != "T2" {
		t.Fatalf("Ext(topic) = %q", v)
	}
	// Python: base64(hmac.new(b"sk", b"akT2", sha1).digest())
	if got := acl.Signature(cmd, "sk"); got != "6qMRrq2jnU4vCiP3K24xDLymOgY=" {
		t.Fatalf("signature %q, want the one over akT2", got)
	}
}

// lengthPrefixed frames a JSON header as DecodeFrame expects it (no body).
func lengthPrefixed(header []byte) []byte {
	out := []byte{0, byte(len(header) >> 16), byte(len(header) >> 8), byte(len(header))} // JSON, header length
	return append(out, header...)
}

// TestSecurityTokenVariants checks the strict and the Go-client-compatible
// handling of SecurityToken.
func TestSecurityTokenVariants(t *testing.T) {
	cfg := &acl.Config{Accounts: []acl.Account{{AccessKey: "account", SecretKey: "secret-key", DefaultTopicPerm: "PUB"}}}
	strict, err := acl.NewPolicy(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.AcceptUnsignedSecurityToken = true
	lenient, err := acl.NewPolicy(cfg)
	if err != nil {
		t.Fatal(err)
	}
	remote := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}
	send := func() *protocol.Command {
		cmd := protocol.NewRequest(protocol.ReqSendMessage)
		cmd.SetExt("topic", "T")
		cmd.Body = []byte("payload")
		return cmd
	}
	// Java-style: the token is signed. Both accept.
	javaStyle := send()
	acl.Sign(javaStyle, acl.Credentials{AccessKey: "account", SecretKey: "secret-key", SecurityToken: "tok"})
	// Go-client style: signature over everything but the token, token added after.
	goStyle := send()
	acl.Sign(goStyle, acl.Credentials{AccessKey: "account", SecretKey: "secret-key"})
	goStyle.SetExt(acl.KeySecurityToken, "tok")
	// A Go-style signature without any token is simply a valid signature.
	for _, tc := range []struct {
		name     string
		p        *acl.Policy
		cmd      *protocol.Command
		wantDeny bool
	}{
		{"strict java", strict, javaStyle, false},
		{"lenient java", lenient, javaStyle, false},
		{"strict go", strict, goStyle, true},
		{"lenient go", lenient, goStyle, false},
	} {
		err := tc.p.Check(tc.cmd, remote)
		if (err != nil) != tc.wantDeny {
			t.Errorf("%s: Check = %v, want denied=%v", tc.name, err, tc.wantDeny)
		}
	}
	// Lenient mode still refuses a body altered after signing.
	goStyle.Body = []byte("PAYLOAD")
	if err := lenient.Check(goStyle, remote); err == nil || !strings.Contains(err.Error(), "signature mismatch") {
		t.Fatalf("altered body with unsigned token: %v", err)
	}
}
