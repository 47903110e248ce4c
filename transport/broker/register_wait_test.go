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
// official Java push consumer looks %RETRY%<group> up in its first
// rebalance, right after its first heartbeat, and missing it then learns
// the route only from its route poll, 30 s later. The name servers here
// answer registrations slowly, so a registration made in the background is
// not there yet.
func TestBrokerNewRetryTopicRegisteredBeforeReply(t *testing.T) {
	subLeakCheck(t)
	var slow atomic.Bool
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Two name servers, each answering registrations slowly once armed:
	// the broker must wait for both.
	var addrs []string
	for range 2 {
		ns, err := namesrv.New(namesrv.WithListenAddr("127.0.0.1:0"), namesrv.WithKVConfigDir(t.TempDir()),
			namesrv.WithRemotingOptions(remoting.WithInterceptor(func(ctx context.Context, rc *remoting.RequestCtx) (*protocol.Command, bool) {
				if rc.Request().Code == protocol.ReqRegisterBroker && slow.Load() {
					time.Sleep(700 * time.Millisecond)
				}
				return nil, false
			})))
		if err != nil {
			t.Fatal(err)
		}
		if err := ns.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ns.Close() })
		addrs = append(addrs, ns.Addr())
	}
	b := subBroker(t, t.TempDir(), &subClock{}, WithNameServers(addrs...))
	var ncs []*remoting.Conn
	for _, a := range addrs {
		ncs = append(ncs, dial(t, a))
	}
	routed := func(topic string) bool {
		for _, nc := range ncs {
			req := protocol.NewRequest(protocol.ReqGetRouteInfoByTopic)
			(&protocol.GetRouteInfoRequestHeader{Topic: topic}).Encode(req)
			if invoke(t, nc, req).Code != protocol.ResSuccess {
				return false
			}
		}
		return true
	}
	waitFor(t, 10*time.Second, "the broker's first registrations", func() bool { return routed("TBW102") })
	slow.Store(true)

	c := subDial(t, b, "10.0.0.7@1")
	if resp := c.heartbeat(t, "cg_new", "", "T"); resp.Code != protocol.ResSuccess {
		t.Fatalf("heartbeat: %d %s", resp.Code, resp.Remark)
	}
	if !routed("%RETRY%cg_new") {
		t.Errorf("heartbeat answered before %s, which it created, was on the name servers", "%RETRY%cg_new")
	}

	_, phys := physOf(t, c.invoke(t, sendReq("T", 0, []byte("x"), "")))
	if resp := c.sendBack(t, "cg_back", phys, -1, protocol.Opt[int32]{}); resp.Code != protocol.ResSuccess {
		t.Fatalf("send back: %d %s", resp.Code, resp.Remark)
	}
	for _, topic := range []string{"%RETRY%cg_back", "%DLQ%cg_back"} {
		if !routed(topic) {
			t.Errorf("send-back answered before %s, which it created, was on the name servers", topic)
		}
	}
}
