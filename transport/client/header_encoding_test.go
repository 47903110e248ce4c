package client

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// frameTypes records the header encodings of the frames a Client's
// connections read.
type frameTypes struct {
	mu   sync.Mutex
	seen map[protocol.SerializeType]int
}

func (f *frameTypes) OnFrameRead(_ *remoting.Conn, cmd *protocol.Command) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen[cmd.SerializeType()]++
}

func (f *frameTypes) counts() map[protocol.SerializeType]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[protocol.SerializeType]int, len(f.seen))
	for k, v := range f.seen {
		out[k] = v
	}
	return out
}

// TestClientHeaderEncodings runs a Client against the embedded name server
// and broker with each header encoding (binary by default, JSON by
// option): route lookups, topic creation, heartbeats, sends and pulls work,
// and every frame the Client reads comes in its own encoding, since the
// name server and the broker answer each request in the encoding it came
// in.
func TestClientHeaderEncodings(t *testing.T) {
	e := newCoreEnv(t)
	for _, tc := range []struct {
		name string
		opts []Option
		want protocol.SerializeType
	}{
		{"default", nil, protocol.SerializeRocketMQ},
		{"json", []Option{WithHeaderEncoding(protocol.SerializeJSON)}, protocol.SerializeJSON},
		{"rocketmq", []Option{WithHeaderEncoding(protocol.SerializeRocketMQ)}, protocol.SerializeRocketMQ},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ft := &frameTypes{seen: map[protocol.SerializeType]int{}}
			c := e.client(append([]Option{WithRemotingOptions(remoting.WithHooks(ft))}, tc.opts...)...)
			topic := "HdrEnc" + tc.name
			qs := e.createTopic(c, topic, 1)
			p, err := NewProducer(c, "hdr-"+tc.name)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			ctx := testCtx(t, 20*time.Second)
			if err := c.heartbeatNow(ctx); err != nil {
				t.Fatal(err)
			}
			const n = 20
			for i := range n {
				m := &Message{Topic: topic, Body: fmt.Appendf(nil, "m%d-\x01é", i), Tags: "tag-é", Keys: []string{fmt.Sprintf("k%d", i)}}
				if _, err := p.Send(ctx, m); err != nil {
					t.Fatalf("send %d: %v", i, err)
				}
			}
			res, err := c.Pull(ctx, PullRequest{Queue: qs[0], Offset: 0, MaxMsgs: 32, Group: "hdr-pull-" + tc.name})
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != PullFound || len(res.Messages) != n {
				t.Fatalf("pull: status %v, %d messages", res.Status, len(res.Messages))
			}
			for i, m := range res.Messages {
				if want := fmt.Sprintf("m%d-\x01é", i); string(m.Body) != want || m.Topic != topic {
					t.Fatalf("message %d: topic %q body %q, want %q", i, m.Topic, m.Body, want)
				}
				if tag, _ := protocol.PropertyValue(m.Properties, protocol.PropTags); tag != "tag-é" {
					t.Fatalf("message %d: tags %q", i, tag)
				}
			}
			got := ft.counts()
			if got[tc.want] < n+2 || len(got) != 1 {
				t.Fatalf("frames read by encoding: %v, want all in type %d", got, tc.want)
			}
		})
	}
}
