package broker

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/namesrv"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// TestBrokerNewRetryTopicRegisteredBeforeReply checks that the topics a
// broker creates while serving a request (%RETRY%<group> on a consumer's
// first heartbeat, %RETRY% and %DLQ% on a send-back) are on the name
// server when the request is answered, as a Java broker does
// (createTopicInSendMessageBackMethod registers before it returns): the
// official Java push consumer looks %RETRY%<group> up right after its first
// heartbeat and, missing it then, pulls no retries until its next
// rebalance. The name server here answers registrations slowly, so a
// registration made in the background is not there yet.
func TestBrokerNewRetryTopicRegisteredBeforeReply(t *testing.T) {
	subLeakCheck(t)
	var slow atomic.Bool
	ns, err := namesrv.New(namesrv.WithListenAddr("127.0.0.1:0"), namesrv.WithKVConfigDir(t.TempDir()),
		namesrv.WithRemotingOptions(remoting.WithInterceptor(func(ctx context.Context, rc *remoting.RequestCtx) (*protocol.Command, bool) {
			if rc.Request().Code == protocol.ReqRegisterBroker && slow.Load() {
				time.Sleep(300 * time.Millisecond)
			}
			return nil, false
		})))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ns.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Close() })
	b := subBroker(t, t.TempDir(), &subClock{}, WithNameServers(ns.Addr()))
	nc := dial(t, ns.Addr())
	routed := func(topic string) bool {
		req := protocol.NewRequest(protocol.ReqGetRouteInfoByTopic)
		(&protocol.GetRouteInfoRequestHeader{Topic: topic}).Encode(req)
		return invoke(t, nc, req).Code == protocol.ResSuccess
	}
	waitFor(t, 10*time.Second, "the broker's first registration", func() bool { return routed("TBW102") })
	slow.Store(true)

	c := subDial(t, b, "10.0.0.7@1")
	if resp := c.heartbeat(t, "cg_new", "", "T"); resp.Code != protocol.ResSuccess {
		t.Fatalf("heartbeat: %d %s", resp.Code, resp.Remark)
	}
	if !routed("%RETRY%cg_new") {
		t.Errorf("heartbeat answered before %s, which it created, was on the name server", "%RETRY%cg_new")
	}

	_, phys := physOf(t, c.invoke(t, sendReq("T", 0, []byte("x"), "")))
	if resp := c.sendBack(t, "cg_back", phys, -1, protocol.Opt[int32]{}); resp.Code != protocol.ResSuccess {
		t.Fatalf("send back: %d %s", resp.Code, resp.Remark)
	}
	for _, topic := range []string{"%RETRY%cg_back", "%DLQ%cg_back"} {
		if !routed(topic) {
			t.Errorf("send-back answered before %s, which it created, was on the name server", topic)
		}
	}
}
