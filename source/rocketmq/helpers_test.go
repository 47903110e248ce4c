package rocketmq

import (
	"context"
	"errors"
	"os"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/source"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

func TestMain(m *testing.M) {
	if os.Getenv(lockChildEnv) != "" {
		os.Exit(lockChild()) // a job process of TestQueueLocksAcrossProcesses
	}
	goleak.VerifyTestMain(m)
}

// cluster is a real name server and broker on loopback with a client.
type cluster struct {
	t      testing.TB
	b      *broker.Broker
	c      *client.Client
	p      *client.Producer
	broker string // broker name
	ns     string // name server address
}

func newCluster(t testing.TB, bopts ...broker.Option) *cluster {
	t.Helper()
	tc := testutil.RunCluster(t, bopts...)
	c := tc.NewClient(t)
	return &cluster{t: t, b: tc.Broker, c: c, p: testutil.NewProducer(t, c, "test_producer"), broker: testutil.BrokerName, ns: tc.NameServer}
}

// createTopic creates topic with n queues and waits until its route shows
// them.
func (cl *cluster) createTopic(topic string, n int) {
	cl.t.Helper()
	testutil.CreateTopic(cl.t, cl.c, cl.b.Addr(), topic, n)
}

func (cl *cluster) queue(topic string, id int) protocol.MessageQueue {
	return protocol.MessageQueue{Topic: topic, BrokerName: cl.broker, QueueID: int32(id)}
}

// produce stores msgs in queue id of topic, in order, in batches.
func (cl *cluster) produce(topic string, id int, msgs ...*client.Message) {
	cl.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q := cl.queue(topic, id)
	for i := range msgs {
		msgs[i].Topic, msgs[i].Queue = topic, &q
	}
	for len(msgs) > 0 {
		n := min(len(msgs), 64)
		if _, err := cl.p.Send(ctx, msgs[:n]...); err != nil {
			cl.t.Fatal(err)
		}
		msgs = msgs[n:]
	}
}

// bodies returns n messages with bodies prefix0 … prefix(n-1).
func bodies(prefix string, n int) []*client.Message {
	msgs := make([]*client.Message, n)
	for i := range msgs {
		msgs[i] = &client.Message{Body: []byte(prefix + strconv.Itoa(i))}
	}
	return msgs
}

// readAll polls r until ErrEndOfSplit, which must come after want records
// (any number when want < 0), and returns copies of the records.
func readAll(t testing.TB, r source.SplitReader[Message], want int) []Message {
	return read(t, r, want, true)
}

// readN polls r until it returned n records.
func readN(t testing.TB, r source.SplitReader[Message], n int) []Message {
	return read(t, r, n, false)
}

func read(t testing.TB, r source.SplitReader[Message], want int, toEnd bool) []Message {
	t.Helper()
	var out []Message
	deadline := time.Now().Add(30 * time.Second)
	for toEnd || len(out) < want {
		if time.Now().After(deadline) {
			t.Fatalf("read %d records before the deadline, want %d", len(out), want)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		n := 100
		if !toEnd {
			n = want - len(out)
		}
		recs, err := r.Poll(ctx, n)
		cancel()
		for i := range recs {
			m := recs[i].Value
			if o, err := DecodeOffset(recs[i].Offset); err != nil || o.Next != m.QueueOffset+1 {
				t.Fatalf("record offset %v (%v) for message at %d", o, err, m.QueueOffset)
			}
			if string(recs[i].Raw) != string(m.Body) {
				t.Fatalf("Raw %q != Body %q", recs[i].Raw, m.Body)
			}
			out = append(out, m.Clone())
		}
		switch {
		case errors.Is(err, source.ErrEndOfSplit):
			if want >= 0 && len(out) != want {
				t.Fatalf("end of split after %d records, want %d", len(out), want)
			}
			return out
		case err == nil, errors.Is(err, context.DeadlineExceeded):
		default:
			t.Fatal(err)
		}
	}
	return out
}

func openSplit(t testing.TB, s *Source, id string, restored []byte) source.SplitReader[Message] {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := s.Open(ctx, source.Split{ID: id}, restored)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}
