package broker

import (
	"testing"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// TestBrokerCheckClientConfig checks CHECK_CLIENT_CONFIG (46), which a
// Java consumer sends at start for a subscription that is not a TAG
// expression: a TAG subscription (or none) is fine; SQL92, which runnel
// does not filter by, gets what a Java broker without enablePropertyFilter
// answers (SYSTEM_ERROR and its remark, which fails the consumer's start,
// where REQUEST_CODE_NOT_SUPPORTED made it fail with another code); a body
// that is not JSON is a SYSTEM_ERROR.
func TestBrokerCheckClientConfig(t *testing.T) {
	subLeakCheck(t)
	b := subBroker(t, t.TempDir(), &subClock{})
	c := subDial(t, b, "10.0.0.8@1")
	for _, tc := range []struct {
		body   string
		code   int32
		remark string
	}{
		{`{"clientId":"10.0.0.8@1","group":"G","subscriptionData":{"topic":"T","subString":"a || b","expressionType":"TAG","tagsSet":["a","b"],"codeSet":[97,98],"subVersion":1}}`,
			protocol.ResSuccess, ""},
		{`{"clientId":"10.0.0.8@1","group":"G","subscriptionData":{"topic":"T","subString":"*","tagsSet":[],"codeSet":[],"subVersion":1}}`,
			protocol.ResSuccess, ""},
		{`{"clientId":"10.0.0.8@1","group":"G"}`, protocol.ResSuccess, ""},
		{`{"clientId":"10.0.0.8@1","group":"G","subscriptionData":{"topic":"T","subString":"a > 1","expressionType":"SQL92","tagsSet":[],"codeSet":[],"subVersion":1}}`,
			protocol.ResSystemError, "The broker does not support consumer to filter message by SQL92"},
		{`{not json`, protocol.ResSystemError, ""},
	} {
		req := protocol.NewRequest(protocol.ReqCheckClientConfig)
		req.Body = []byte(tc.body)
		resp := c.invoke(t, req)
		if resp.Code != tc.code || (tc.remark != "" && resp.Remark != tc.remark) {
			t.Errorf("CHECK_CLIENT_CONFIG %s: code %d %q, want %d %q", tc.body, resp.Code, resp.Remark, tc.code, tc.remark)
		}
	}
}

// TestBrokerPullRegisteredSQL92Refused pulls, without the subscription
// flag, for a group whose heartbeat registered an SQL92 subscription: a
// Java broker without enablePropertyFilter answers SYSTEM_ERROR (runnel
// filtered nothing there, delivering what the consumer had not selected);
// the group's TAG subscription of another topic still pulls.
func TestBrokerPullRegisteredSQL92Refused(t *testing.T) {
	subLeakCheck(t)
	b := subBroker(t, t.TempDir(), &subClock{})
	c := subDial(t, b, "10.0.0.9@1")
	send(t, c.Conn, "T", 0, []byte("x"), props("TAGS", "a"))
	send(t, c.Conn, "U", 0, []byte("y"), props("TAGS", "a"))
	req := protocol.NewRequest(protocol.ReqHeartbeat)
	req.Body = []byte(`{"clientID":"10.0.0.9@1","consumerDataSet":[{"groupName":"G","consumeType":"CONSUME_PASSIVELY",` +
		`"messageModel":"CLUSTERING","consumeFromWhere":"CONSUME_FROM_FIRST_OFFSET","subscriptionDataSet":[` +
		`{"topic":"T","subString":"i > 1","expressionType":"SQL92","tagsSet":[],"codeSet":[],"subVersion":1},` +
		`{"topic":"U","subString":"a","expressionType":"TAG","tagsSet":["a"],"codeSet":[97],"subVersion":1}]}]}`)
	if resp := c.invoke(t, req); resp.Code != protocol.ResSuccess {
		t.Fatalf("heartbeat: %d %q", resp.Code, resp.Remark)
	}
	resp := invoke(t, c.Conn, pullRequest(pullArgs{group: "G", topic: "T", max: 32}))
	if resp.Code != protocol.ResSystemError || resp.Remark != "The broker does not support consumer to filter message by SQL92" {
		t.Errorf("pull of a registered SQL92 subscription: code %d %q, want SYSTEM_ERROR", resp.Code, resp.Remark)
	}
	if r := pull(t, c.Conn, pullArgs{group: "G", topic: "U", max: 32}); r.code != protocol.ResSuccess || len(r.msgs) != 1 {
		t.Errorf("pull of the TAG subscription: code %d, %d messages", r.code, len(r.msgs))
	}
}
