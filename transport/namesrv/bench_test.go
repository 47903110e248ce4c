package namesrv

import (
	"fmt"
	"testing"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// benchServer returns an unstarted server with nBrokers master brokers, each
// registered with the topic "Bench" and 50 others.
func benchServer(b *testing.B, nBrokers int) *Server {
	b.Helper()
	s, err := New()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	for i := range nBrokers {
		tcs := []protocol.TopicConfig{topic("Bench", 8, 8, 6)}
		for j := range 50 {
			tcs = append(tcs, topic(fmt.Sprintf("T%d", j), 4, 4, 6))
		}
		br := &broker{cluster: "C", name: fmt.Sprintf("broker-%d", i), addr: fmt.Sprintf("10.0.0.%d:10911", i+1),
			ha: "x:1", topics: topics(tcs...)}
		if resp := s.registerBroker(br.registerRequest(b), nil); resp.Code != 0 {
			b.Fatal(resp.Remark)
		}
	}
	return s
}

// BenchmarkRouteLookup is GET_ROUTEINFO_BY_TOPIC through the processor
// (no network) for a topic on 3 brokers.
func BenchmarkRouteLookup(b *testing.B) {
	s := benchServer(b, 3)
	req := routeRequest("Bench")
	b.ReportAllocs()
	for b.Loop() {
		if resp := s.getRouteInfo(req, nil); resp.Code != 0 {
			b.Fatal(resp.Remark)
		}
	}
}

// BenchmarkRegisterBroker is a periodic re-registration (51 topics,
// unchanged data version) through the processor, body decode included.
func BenchmarkRegisterBroker(b *testing.B) {
	s := benchServer(b, 1)
	br := &broker{cluster: "C", name: "broker-0", addr: "10.0.0.1:10911", ha: "x:1"}
	tcs := []protocol.TopicConfig{topic("Bench", 8, 8, 6)}
	for j := range 50 {
		tcs = append(tcs, topic(fmt.Sprintf("T%d", j), 4, 4, 6))
	}
	br.topics = topics(tcs...)
	req := br.registerRequest(b)
	b.SetBytes(int64(len(req.Body)))
	b.ReportAllocs()
	for b.Loop() {
		if resp := s.registerBroker(req, nil); resp.Code != 0 {
			b.Fatal(resp.Remark)
		}
	}
}
