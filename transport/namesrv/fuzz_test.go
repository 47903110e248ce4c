package namesrv

import (
	"encoding/json"
	"testing"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// FuzzRegisterBroker feeds arbitrary REGISTER_BROKER bodies (both body
// forms, compressed or not) and broker addresses through the processor.
//
// Invariants: the handler never panics and always answers; when it
// accepts a registration, every topic it routes has a valid JSON route body
// that the Go client's parse rules (protocol §5.1) read back with exactly
// the registered address, and the cluster info is valid JSON.
func FuzzRegisterBroker(f *testing.F) {
	full := brokerA().registerRequest(f)
	f.Add(full.Body, int16(protocol.CurrentVersion), false, "127.0.0.1:10911")
	w := protocol.TopicConfigSerializeWrapper{TopicConfigTable: topics(topic("a", 1, 1, 6), topic("b", 2, 2, 7))}
	old, _ := w.Encode()
	f.Add(old, int16(30), false, "10.0.0.1:1")
	comp, _ := (&protocol.RegisterBrokerBody{TopicConfigSerializeWrapper: w}).EncodeCompressed()
	f.Add(comp, int16(400), true, "[::1]:10911")
	f.Add([]byte(`{"topicConfigSerializeWrapper":{"topicConfigTable":{"x":{"readQueueNums":-1}}}}`), int16(400), false, "h:1")
	f.Add([]byte(`{"filterServerList":["a"],"topicConfigSerializeWrapper":{"dataVersion":{"counter":1},"topicConfigTable":{"x":{},"y":{"topicName":"z"}}}}`), int16(400), false, "h:1")
	f.Add([]byte{}, int16(400), false, "h:1")

	f.Fuzz(func(t *testing.T, body []byte, version int16, compressed bool, addr string) {
		s, err := New()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close() //nolint:errcheck // never started
		req := protocol.NewRequest(protocol.ReqRegisterBroker)
		(&protocol.RegisterBrokerRequestHeader{BrokerName: "b", BrokerAddr: addr, ClusterName: "c",
			HAServerAddr: "h:2", Compressed: protocol.Some(compressed)}).Encode(req)
		req.Version = int32(version)
		req.Body = body
		resp := s.registerBroker(req, nil)
		if resp == nil {
			t.Fatal("no response")
		}
		if resp.Code != protocol.ResSuccess {
			return
		}
		for _, topic := range s.routes.topicList() {
			r := s.getRouteInfo(routeRequest(topic), nil)
			if r.Code != protocol.ResSuccess {
				t.Fatalf("topic %q listed but not routed: %d %s", topic, r.Code, r.Remark)
			}
			if !json.Valid(r.Body) {
				t.Fatalf("route of %q is not JSON: %s", topic, r.Body)
			}
			g, err := parseLikeGoClient(r.Body)
			if err != nil {
				t.Fatalf("Go client parse of %s: %v", r.Body, err)
			}
			if got := g.brokers["b"][0]; got != addr {
				t.Fatalf("Go client reads address %q, registered %q (route %s)", got, addr, r.Body)
			}
		}
		ci := s.getClusterInfo(protocol.NewRequest(protocol.ReqGetBrokerClusterInfo), nil)
		if !json.Valid(ci.Body) {
			t.Fatalf("cluster info is not JSON: %s", ci.Body)
		}
	})
}
