package rocketmq_test

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/embedded"
	"github.com/runnel-dev/runnel/internal/backoff"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/sink"
	mqsink "github.com/runnel-dev/runnel/sink/rocketmq"
	"github.com/runnel-dev/runnel/sink/sinktest"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/client"
)

// Check-back timing of the conformance clusters: half messages no
// checkpoint lists are checked back (and rolled back by the sink's new
// instance) within about a second, and none is discarded while a check
// runs (discard after checkMax check-backs).
const (
	confTxTimeout  = 500 * time.Millisecond
	confTxInterval = 100 * time.Millisecond
	confTxCheckMax = 1000
	confDiscard    = confTxTimeout + confTxCheckMax*confTxInterval
)

// confCluster starts an embedded cluster for one conformance check, with a
// topic "out".
func confCluster(t *testing.T) *embedded.Cluster {
	t.Helper()
	tc := testutil.RunCluster(t, broker.WithTransactionTimeout(confTxTimeout),
		broker.WithTransactionCheckInterval(confTxInterval), broker.WithTransactionCheckMax(confTxCheckMax))
	c := tc.NewClient(t)
	testutil.CreateTopic(t, c, tc.BrokerAddr, "out", 2)
	return tc.Embedded
}

// newClient is the client of one sink instance (one process of the job).
//
// It learns the route of "out" at once and heartbeats every 100 ms, as
// the client of a job that reads or writes the cluster does (at its 30 s
// default interval): the broker checks half messages back only with
// producers that heartbeated, and a client heartbeats only the brokers of
// routes it holds (as Apache RocketMQ 5's client does, where
// DefaultMQProducer.setTopics declares them ahead; 4.x producers held
// TBW102's route from the start). ExactlyOnce's Recover does not learn the
// routes of the transactions it recovers: a new instance that has sent
// nothing yet is unknown to the broker, and the half messages its crashed
// predecessor left open stay open until it has (RecoverAbortsOthers fails
// without these two options).
func newClient(ctx context.Context, cl *embedded.Cluster) (*client.Client, error) {
	c, err := client.New(client.WithNameServers(cl.NameServer()), client.WithClientIP(netip.MustParseAddr("127.0.0.1")),
		client.WithHeartbeatInterval(100*time.Millisecond))
	if err != nil {
		return nil, err
	}
	if _, err := c.Route(ctx, "out"); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

func mapper(k string) (*client.Message, error) {
	return &client.Message{Topic: "out", Body: []byte(k), Keys: []string{k}, ShardingKey: k}, nil
}

// visible returns the bodies of the messages stored in topic "out".
func visible(cl *embedded.Cluster) func(ctx context.Context) ([]string, error) {
	return func(ctx context.Context) ([]string, error) {
		msgs, err := cl.Messages(ctx, "out")
		if err != nil {
			return nil, err
		}
		keys := make([]string, len(msgs))
		for i := range msgs {
			keys[i] = string(msgs[i].Body)
		}
		return keys, nil
	}
}

// exactlyOnce is an ExactlyOnce sink with the client it owns (a sink does
// not own its client; a process of the job does).
type exactlyOnce struct {
	*mqsink.ExactlyOnce[string]
	c *client.Client
}

func (s exactlyOnce) Close() error { return errors.Join(s.ExactlyOnce.Close(), s.c.Close()) }

// TestExactlyOnceConformance runs the exactly-once sink through the
// two-phase-commit checks (sinktest) on the embedded broker, each instance
// with a client of its own as a new process of the job would have, all of
// one producer group. Open counts the half messages the broker holds
// neither committed nor rolled back: after a crash, the new instance's
// check-back answers roll back those no completed checkpoint lists.
func TestExactlyOnceConformance(t *testing.T) {
	sinktest.RunTwoPhaseCommit(t, sinktest.Features{}, func(t *testing.T) sinktest.System[string] {
		cl := confCluster(t)
		group := mqsink.TxGroup("conformance", "out")
		return sinktest.System[string]{
			New: func(ctx context.Context) (sink.Sink[string], error) {
				c, err := newClient(ctx, cl)
				if err != nil {
					return nil, err
				}
				s, err := mqsink.NewExactlyOnce(c, mapper, mqsink.WithTxGroup(group),
					mqsink.WithTxRetry(3, backoff.Policy{Initial: time.Millisecond}), mqsink.WithDiscardWindow(confDiscard))
				if err != nil {
					_ = c.Close()
					return nil, err
				}
				return exactlyOnce{ExactlyOnce: s, c: c}, nil
			},
			Record:  func(k string) string { return k },
			Visible: visible(cl),
			Open: func(context.Context) (int, error) {
				st := cl.Broker(0).Server().TransactionStats()
				return int(st.Prepared - st.Committed - st.RolledBack - st.Discarded), nil
			},
		}
	})
}

// atLeastOnce is an at-least-once Sink with the producer and client it is
// given (owned here by the simulated process).
type atLeastOnce struct {
	*mqsink.Sink[string]
	p *client.Producer
	c *client.Client
}

func (s atLeastOnce) Close() error {
	return errors.Join(s.Sink.Close(), s.p.Close(), s.c.Close())
}

// TestSinkConformance runs the at-least-once sink through the plain sink
// checks: once Flush returned, every record written before it is stored.
func TestSinkConformance(t *testing.T) {
	sinktest.Run(t, sinktest.Features{}, func(t *testing.T) sinktest.System[string] {
		cl := confCluster(t)
		return sinktest.System[string]{
			New: func(ctx context.Context) (sink.Sink[string], error) {
				c, err := newClient(ctx, cl)
				if err != nil {
					return nil, err
				}
				p, err := client.NewProducer(c, "conformance_plain")
				if err != nil {
					_ = c.Close()
					return nil, err
				}
				s, err := mqsink.New(p, mapper)
				if err != nil {
					_ = errors.Join(p.Close(), c.Close())
					return nil, err
				}
				return atLeastOnce{Sink: s, p: p, c: c}, nil
			},
			Record:  func(k string) string { return k },
			Visible: visible(cl),
		}
	})
}
