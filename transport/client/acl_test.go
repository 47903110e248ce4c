package client

import (
	"testing"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// Expected signatures were computed independently (Python hmac/hashlib):
// base64(HMAC-SHA1(secret, content)).
func TestACLSignatureVectors(t *testing.T) {
	cases := []struct {
		name    string
		ext     [][2]string
		body    []byte
		cr      Credentials
		content string // documentation of what is signed
		want    string
	}{
		{
			name: "reference example", ext: [][2]string{{"topic", "T"}},
			cr: Credentials{AccessKey: "ak", SecretKey: "sk"}, content: "akT",
			want: "vX6jW2Q9g11lvMjNC+gReuZ8fTQ=",
		},
		{
			name: "security token is signed", ext: [][2]string{{"topic", "T"}},
			cr: Credentials{AccessKey: "ak", SecretKey: "sk", SecurityToken: "tok"}, content: "aktokT",
			want: "lBJAxv3ke6xvagX3v2rETxrIBbQ=",
		},
		{
			name: "body appended raw", ext: [][2]string{{"topic", "T"}}, body: []byte("\x00\x01\x02body"),
			cr: Credentials{AccessKey: "ak", SecretKey: "sk"}, content: "akT\\x00\\x01\\x02body",
			want: "slPpg7mzeA3fTwWdBFkO+fcl09A=",
		},
		{
			name: "stale signature excluded", ext: [][2]string{{"Signature", "old"}, {"topic", "T"}},
			cr: Credentials{AccessKey: "ak", SecretKey: "sk"}, content: "akT",
			want: "vX6jW2Q9g11lvMjNC+gReuZ8fTQ=",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cmd := protocol.NewRequest(protocol.ReqSendMessage)
			for _, kv := range tc.ext {
				cmd.SetExt(kv[0], kv[1])
			}
			cmd.Body = tc.body
			signCommand(cmd, tc.cr, newSigner())
			if got, _ := cmd.Ext("Signature"); got != tc.want {
				t.Fatalf("Signature over %q = %q, want %q", tc.content, got, tc.want)
			}
			if got, _ := cmd.Ext("AccessKey"); got != tc.cr.AccessKey {
				t.Fatalf("AccessKey = %q", got)
			}
			tok, ok := cmd.Ext("SecurityToken")
			if tc.cr.SecurityToken != "" && tok != tc.cr.SecurityToken || tc.cr.SecurityToken == "" && ok {
				t.Fatalf("SecurityToken = %q, %v", tok, ok)
			}
			// Re-signing a reused command (a retry) gives the same signature.
			signCommand(cmd, tc.cr, newSigner())
			if got, _ := cmd.Ext("Signature"); got != tc.want {
				t.Fatalf("second Signature = %q, want %q", got, tc.want)
			}
		})
	}
}

func BenchmarkACLSign(b *testing.B) {
	cmd := protocol.NewRequest(protocol.ReqSendMessageV2)
	h := protocol.SendMessageRequestHeaderV2{ProducerGroup: "pg", Topic: "T", DefaultTopic: "TBW102", DefaultTopicQueueNums: 4,
		QueueID: 1, BornTimestamp: 1700000000000, Properties: "UNIQ_KEY\x010A000005000000000000000000000001\x02"}
	h.Encode(cmd)
	cmd.Body = make([]byte, 1024)
	s := newSigner()
	cr := Credentials{AccessKey: "ak", SecretKey: "sk"}
	b.ReportAllocs()
	for b.Loop() {
		signCommand(cmd, cr, s)
	}
}
