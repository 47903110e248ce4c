package broker

import (
	"fmt"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

func TestBrokerReplyPush(t *testing.T) {
	subLeakCheck(t)
	b := subBroker(t, t.TempDir(), &subClock{})
	requester := subDial(t, b, "10.0.0.9@42")
	replier := subDial(t, b, "10.0.0.7@7")
	requester.heartbeat(t, "", "request-pg")
	replier.heartbeat(t, "", "reply-pg")

	replyTopic := b.clusterName() + "_REPLY_TOPIC"
	props := map[string]string{
		"REPLY_TO_CLIENT": "10.0.0.9@42",
		"CORRELATION_ID":  "corr-1",
		"MSG_TYPE":        "reply",
		"CLUSTER":         b.clusterName(),
	}
	for _, code := range []int32{protocol.ReqSendReplyMessage, protocol.ReqSendReplyMessageV2} {
		var resp *protocol.Command
		if code == protocol.ReqSendReplyMessage {
			resp = replier.send(t, code, replyTopic, 0, "the answer", props, 0, 0)
		} else {
			req := protocol.NewRequest(code)
			h := protocol.SendMessageRequestHeaderV2{ProducerGroup: "reply-pg", Topic: replyTopic, DefaultTopic: "TBW102",
				DefaultTopicQueueNums: 4, BornTimestamp: time.Now().UnixMilli(),
				Properties: string(protocol.AppendProperties(nil, props))}
			h.Encode(req)
			req.Body = []byte("the answer")
			resp = replier.invoke(t, req)
		}
		if resp.Code != protocol.ResSuccess {
			t.Fatalf("code %d: send reply: %d %q", code, resp.Code, resp.Remark)
		}
	}
	subEventually(t, 5*time.Second, func() error {
		if n := len(requester.requests(protocol.ReqPushReplyMessageToClient)); n != 2 {
			return fmt.Errorf("requester got %d pushes, want 2", n)
		}
		return nil
	})
	stored := subMessages(t, b, replyTopic, 0)
	if len(stored) != 2 {
		t.Fatalf("reply topic holds %d", len(stored))
	}
	// The pushes come from several workers, in either order: each must
	// carry the store time of one stored reply.
	storeTimes := map[int64]int{}
	for _, m := range stored {
		storeTimes[m.StoreTimestamp]++
	}
	for i, push := range requester.requests(protocol.ReqPushReplyMessageToClient) {
		var h protocol.ReplyMessageRequestHeader
		if err := h.Decode(push); err != nil {
			t.Fatal(err)
		}
		if push.IsOneway() || string(push.Body) != "the answer" || h.Topic != replyTopic {
			t.Errorf("push %d: oneway %v body %q topic %q", i, push.IsOneway(), push.Body, h.Topic)
		}
		if h.StoreHost != b.AdvertisedAddr() || storeTimes[h.StoreTimestamp] == 0 {
			t.Errorf("push %d: storeHost %q storeTimestamp %d, want %q and the store time of a stored reply %v", i, h.StoreHost, h.StoreTimestamp,
				b.AdvertisedAddr(), storeTimes)
		}
		storeTimes[h.StoreTimestamp]--
		if ap, err := netip.ParseAddrPort(h.BornHost); err != nil || ap != netip.MustParseAddrPort(replier.LocalAddr().String()) {
			t.Errorf("push %d: bornHost %q, want %s", i, h.BornHost, replier.LocalAddr())
		}
		for _, k := range []string{"CORRELATION_ID", "REPLY_TO_CLIENT", "MSG_TYPE"} {
			if v, _ := protocol.PropertyValue(h.Properties, k); v != props[k] {
				t.Errorf("push %d: property %s = %q", i, k, v)
			}
		}
		if v, _ := protocol.PropertyValue(h.Properties, protocol.PropPushReplyTime); v == "" {
			t.Errorf("push %d: no PUSH_REPLY_TIME", i)
		} else if _, err := strconv.ParseInt(v, 10, 64); err != nil {
			t.Errorf("push %d: PUSH_REPLY_TIME %q", i, v)
		}
	}

	// A reply to a requester that is not connected is still stored.
	props["REPLY_TO_CLIENT"] = "gone@1"
	if resp := replier.send(t, protocol.ReqSendReplyMessage, replyTopic, 0, "lost", props, 0, 0); resp.Code != protocol.ResSuccess {
		t.Fatalf("send reply: %d", resp.Code)
	}
	if n := len(subMessages(t, b, replyTopic, 0)); n != 3 {
		t.Errorf("reply topic holds %d, want 3", n)
	}
	// Ordinary sends are never pushed.
	props["REPLY_TO_CLIENT"] = "10.0.0.9@42"
	replier.send(t, protocol.ReqSendMessage, "T", 0, "not a reply", props, 0, 0)
	subNever(t, 200*time.Millisecond, func() bool {
		return len(requester.requests(protocol.ReqPushReplyMessageToClient)) > 2
	}, "push of a normal message")
}
