package broker

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// sqlPull is a pull request carrying a subscription of type typ.
func sqlPull(a pullArgs, typ string) *protocol.Command {
	req := protocol.NewRequest(protocol.ReqPullMessage)
	if a.group == "" {
		a.group = "cg"
	}
	h := protocol.PullMessageRequestHeader{
		ConsumerGroup: a.group, Topic: a.topic, QueueID: a.queue, QueueOffset: a.offset,
		MaxMsgNums: a.max, SysFlag: a.sysFlag | protocol.PullFlagSubscription, SuspendTimeoutMillis: a.suspendMS,
		Subscription: a.sub, ExpressionType: typ,
	}
	h.Encode(req)
	return req
}

// TestBrokerSQL92Pull pulls with SQL92 subscriptions from a broker with
// WithPropertyFilter: only messages whose properties the expression holds
// TRUE for come back (system properties such as TAGS included), a range
// with none is PULL_RETRY_IMMEDIATELY past it, a selector that does not
// parse is SUBSCRIPTION_PARSE_FAILED; without the option a valid selector
// is SYSTEM_ERROR and an invalid one still SUBSCRIPTION_PARSE_FAILED (Java
// parses before it checks enablePropertyFilter).
func TestBrokerSQL92Pull(t *testing.T) {
	subLeakCheck(t)
	b := subBroker(t, t.TempDir(), &subClock{}, WithPropertyFilter(true))
	c := subDial(t, b, "10.0.0.7@1")
	for i, p := range []string{
		props("TAGS", "a", "n", "1", "color", "red"),
		props("TAGS", "b", "n", "5", "color", "blue"),
		props("TAGS", "a", "n", "12"),
		props("n", "x"), // fails to convert: never matches a numeric comparison
		props("TAGS", "c", "n", "7", "color", "red"),
	} {
		send(t, c.Conn, "T", 0, []byte{byte('0' + i)}, p)
	}
	for _, tc := range []struct {
		sql  string
		want []string
	}{
		{"n > 3", []string{"1", "2", "4"}},
		{"color = 'red'", []string{"0", "4"}},
		{"TAGS IN ('a', 'c') AND n BETWEEN 2 AND 12", []string{"2", "4"}},
		{"color IS NULL", []string{"2", "3"}},
		{"NOT (color = 'red') OR n = 1", []string{"0", "1"}},
	} {
		r := decodePull(t, c.invoke(t, sqlPull(pullArgs{topic: "T", max: 32, sub: tc.sql}, protocol.ExpressionTypeSQL92)))
		if r.code != protocol.ResSuccess || !equalStrings(bodies(r.msgs), tc.want) || r.h.NextBeginOffset != 5 {
			t.Errorf("%q: code %d, bodies %v, next %d; want %v, next 5", tc.sql, r.code, bodies(r.msgs), r.h.NextBeginOffset, tc.want)
		}
	}
	r := decodePull(t, c.invoke(t, sqlPull(pullArgs{topic: "T", max: 32, sub: "n > 100"}, protocol.ExpressionTypeSQL92)))
	if r.code != protocol.ResPullRetryImmediately || r.h.NextBeginOffset != 5 {
		t.Errorf("nothing selected: code %d next %d, want PULL_RETRY_IMMEDIATELY next 5", r.code, r.h.NextBeginOffset)
	}
	for _, tc := range []struct {
		sql, typ string
		code     int32
	}{
		{"n >", protocol.ExpressionTypeSQL92, protocol.ResSubscriptionParseFailed},
		{"a = NULL", protocol.ExpressionTypeSQL92, protocol.ResSubscriptionParseFailed},
		{"n > 1", "XPATH", protocol.ResSubscriptionParseFailed},
	} {
		if resp := c.invoke(t, sqlPull(pullArgs{topic: "T", max: 32, sub: tc.sql}, tc.typ)); resp.Code != tc.code {
			t.Errorf("%s %q: code %d %q, want %d", tc.typ, tc.sql, resp.Code, resp.Remark, tc.code)
		}
	}

	off := subBroker(t, t.TempDir(), &subClock{})
	oc := subDial(t, off, "10.0.0.7@2")
	send(t, oc.Conn, "T", 0, []byte("x"), props("n", "5"))
	if resp := oc.invoke(t, sqlPull(pullArgs{topic: "T", max: 32, sub: "n > 1"}, protocol.ExpressionTypeSQL92)); resp.Code != protocol.ResSystemError ||
		resp.Remark != "The broker does not support consumer to filter message by SQL92" {
		t.Errorf("SQL92 without the option: code %d %q, want SYSTEM_ERROR", resp.Code, resp.Remark)
	}
	if resp := oc.invoke(t, sqlPull(pullArgs{topic: "T", max: 32, sub: "n >"}, protocol.ExpressionTypeSQL92)); resp.Code != protocol.ResSubscriptionParseFailed {
		t.Errorf("bad SQL92 without the option: code %d %q, want SUBSCRIPTION_PARSE_FAILED", resp.Code, resp.Remark)
	}
}

func equalStrings(a, b []string) bool { return slices.Equal(a, b) }

// sqlHeartbeat registers consumer group G of client c with one SQL92
// subscription of T.
func sqlHeartbeat(t *testing.T, c *subClient, expr string, version int64) {
	t.Helper()
	hb := protocol.HeartbeatData{ClientID: c.id, ConsumerDataSet: []protocol.ConsumerData{{
		GroupName: "G", ConsumeType: protocol.ConsumePassively, MessageModel: protocol.MessageModelClustering,
		ConsumeFromWhere: protocol.ConsumeFromFirstOffset,
		SubscriptionDataSet: []protocol.SubscriptionData{{Topic: "T", SubString: expr, ExpressionType: protocol.ExpressionTypeSQL92,
			TagsSet: []string{}, CodeSet: protocol.TagCodes{}, SubVersion: version}},
	}}}
	body, err := hb.Encode()
	if err != nil {
		t.Fatal(err)
	}
	req := protocol.NewRequest(protocol.ReqHeartbeat)
	req.Body = body
	if resp := c.invoke(t, req); resp.Code != protocol.ResSuccess {
		t.Fatalf("heartbeat: %d %q", resp.Code, resp.Remark)
	}
}

// TestBrokerSQL92Registered pulls without the subscription flag, as a Java
// push consumer does, for a SQL92 subscription registered by heartbeat: the
// broker filters by it; a registered expression that does not parse has no
// filter data (FILTER_DATA_NOT_EXIST); CHECK_CLIENT_CONFIG accepts the
// good expression and refuses the bad one with SUBSCRIPTION_PARSE_FAILED.
func TestBrokerSQL92Registered(t *testing.T) {
	subLeakCheck(t)
	b := subBroker(t, t.TempDir(), &subClock{}, WithPropertyFilter(true))
	c := subDial(t, b, "10.0.0.8@1")
	for i := range 6 {
		send(t, c.Conn, "T", 0, []byte{byte('0' + i)}, props("i", itoa(i)))
	}
	sqlHeartbeat(t, c, "i >= 2 AND i < 5", 1)
	r := pull(t, c.Conn, pullArgs{group: "G", topic: "T", max: 32})
	if r.code != protocol.ResSuccess || !equalStrings(bodies(r.msgs), []string{"2", "3", "4"}) {
		t.Errorf("registered SQL92: code %d bodies %v, want 2 3 4", r.code, bodies(r.msgs))
	}
	sqlHeartbeat(t, c, "i >=", 2)
	if resp := c.invoke(t, pullRequest(pullArgs{group: "G", topic: "T", max: 32})); resp.Code != protocol.ResFilterDataNotExist {
		t.Errorf("registered bad SQL92: code %d %q, want FILTER_DATA_NOT_EXIST", resp.Code, resp.Remark)
	}
	for _, tc := range []struct {
		sub  string
		code int32
	}{
		{"i > 1", protocol.ResSuccess},
		{"i >", protocol.ResSubscriptionParseFailed},
	} {
		req := protocol.NewRequest(protocol.ReqCheckClientConfig)
		req.Body = []byte(`{"clientId":"10.0.0.8@1","group":"G","subscriptionData":{"topic":"T","subString":"` + tc.sub +
			`","expressionType":"SQL92","tagsSet":[],"codeSet":[],"subVersion":1}}`)
		if resp := c.invoke(t, req); resp.Code != tc.code {
			t.Errorf("CHECK_CLIENT_CONFIG %q: code %d %q, want %d", tc.sub, resp.Code, resp.Remark, tc.code)
		}
	}
}

// TestBrokerFilterLongPollWakeup parks filtered long polls (SQL92 and TAG)
// and stores a message the filter drops, then, a while later, one it
// selects: the parked pull must stay parked through the first and answer
// the second (as Java's PullRequestHoldService wakes a held pull only for a
// matching message); without the filter check on wake-up it answered
// PULL_RETRY_IMMEDIATELY for the first. A parked pull whose suspend time
// ends after only dropped messages answers PULL_RETRY_IMMEDIATELY past
// them.
func TestBrokerFilterLongPollWakeup(t *testing.T) {
	subLeakCheck(t)
	b := subBroker(t, t.TempDir(), &subClock{}, WithPropertyFilter(true))
	c := subDial(t, b, "10.0.0.9@1")
	for _, tc := range []struct {
		name, typ, sub string
		drop, keep     string
	}{
		{"sql92", protocol.ExpressionTypeSQL92, "k = 'yes'", props("k", "no"), props("k", "yes")},
		{"tag", protocol.ExpressionTypeTag, "a", props("TAGS", "b"), props("TAGS", "a")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topic := "W" + tc.name
			send(t, c.Conn, topic, 0, []byte("first"), tc.keep)
			args := pullArgs{topic: topic, offset: 1, max: 32, sysFlag: protocol.PullFlagSuspend, suspendMS: 20000, sub: tc.sub}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			got := make(chan pullResult, 1)
			go func() {
				resp, err := c.Invoke(ctx, sqlPull(args, tc.typ))
				if err != nil {
					t.Error(err)
					got <- pullResult{code: -1}
					return
				}
				got <- decodePull(t, resp)
			}()
			waitFor(t, 10*time.Second, "the pull to park", func() bool { return b.lp.count.Load() == 1 })
			send(t, c.Conn, topic, 0, []byte("dropped"), tc.drop)
			select {
			case r := <-got:
				t.Fatalf("answered on a message its filter drops: code %d next %d %v", r.code, r.h.NextBeginOffset, bodies(r.msgs))
			case <-time.After(300 * time.Millisecond):
			}
			send(t, c.Conn, topic, 0, []byte("kept"), tc.keep)
			r := <-got
			if r.code != protocol.ResSuccess || !equalStrings(bodies(r.msgs), []string{"kept"}) || r.h.NextBeginOffset != 3 {
				t.Errorf("woken pull: code %d %v next %d, want the kept message, next 3", r.code, bodies(r.msgs), r.h.NextBeginOffset)
			}

			// Only dropped messages until the suspend ends.
			args.offset, args.suspendMS = 3, 1000
			go func() {
				resp, err := c.Invoke(ctx, sqlPull(args, tc.typ))
				if err != nil {
					t.Error(err)
					got <- pullResult{code: -1}
					return
				}
				got <- decodePull(t, resp)
			}()
			waitFor(t, 10*time.Second, "the pull to park", func() bool { return b.lp.count.Load() == 1 })
			send(t, c.Conn, topic, 0, []byte("dropped"), tc.drop)
			r = <-got
			if r.code != protocol.ResPullRetryImmediately || r.h.NextBeginOffset != 4 {
				t.Errorf("suspend over after a dropped message: code %d next %d, want PULL_RETRY_IMMEDIATELY next 4", r.code, r.h.NextBeginOffset)
			}
		})
	}
}
