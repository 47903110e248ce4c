package interop

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	rocketmq "github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// This file is self-contained (txi prefix): the official Go client's
// transaction producer against runnel's broker: commit, rollback, and
// unknown → check-back → commit / rollback.

// txiListener decides each message's outcome from its "want" property:
// "commit" and "rollback" at once; "check-commit" and "check-rollback"
// answer unknown first and decide when the broker checks back.
type txiListener struct {
	mu     sync.Mutex
	checks map[string]int // want property → check-backs received
	badPG  int            // check-backs without the producer group
}

func (l *txiListener) ExecuteLocalTransaction(m *primitive.Message) primitive.LocalTransactionState {
	switch m.GetProperty("want") {
	case "commit":
		return primitive.CommitMessageState
	case "rollback":
		return primitive.RollbackMessageState
	}
	return primitive.UnkonwnState
}

func (l *txiListener) CheckLocalTransaction(m *primitive.MessageExt) primitive.LocalTransactionState {
	l.mu.Lock()
	defer l.mu.Unlock()
	want := m.GetProperty("want")
	l.checks[want]++
	if m.GetProperty(primitive.PropertyProducerGroup) == "" {
		l.badPG++
	}
	switch want {
	case "check-commit":
		return primitive.CommitMessageState
	case "check-rollback":
		return primitive.RollbackMessageState
	}
	return primitive.UnkonwnState
}

func (l *txiListener) checked(want string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.checks[want]
}

// txiBodies pulls every message of topic's queues 0..queues-1 over a raw
// connection and returns the bodies, sorted.
func txiBodies(t *testing.T, addr, topic string, queues int32) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := remoting.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var out []string
	for q := range queues {
		for off := int64(0); ; {
			req := protocol.NewRequest(protocol.ReqPullMessage)
			(&protocol.PullMessageRequestHeader{ConsumerGroup: "txi-reader", Topic: topic, QueueID: q,
				QueueOffset: off, MaxMsgNums: 32, SysFlag: protocol.PullFlagSubscription, Subscription: "*",
				ExpressionType: protocol.ExpressionTypeTag}).Encode(req)
			resp, err := conn.Invoke(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.Code != protocol.ResSuccess {
				break
			}
			var h protocol.PullMessageResponseHeader
			if err := h.Decode(resp); err != nil {
				t.Fatal(err)
			}
			if err := protocol.DecodeRecords(resp.Body, func(m *protocol.MessageExt) bool {
				out = append(out, string(m.Body))
				return true
			}); err != nil {
				t.Fatal(err)
			}
			if h.NextBeginOffset <= off {
				break
			}
			off = h.NextBeginOffset
		}
	}
	slices.Sort(out)
	return out
}

func TestOfficialTransactionProducer(t *testing.T) {
	// A fast transaction check-back.
	env := startBrokerEnv(t, broker.WithTransactionCheckInterval(100*time.Millisecond),
		broker.WithTransactionTimeout(500*time.Millisecond))
	nsAddr, addr := env.nsAddr, env.b.Addr()
	topic := fmt.Sprintf("txi_%d", time.Now().UnixNano()%1_000_000)
	group := topic + "_pg"
	l := &txiListener{checks: map[string]int{}}
	p, err := rocketmq.NewTransactionProducer(l, producer.WithNameServer([]string{nsAddr}),
		producer.WithGroupName(group), producer.WithInstanceName(topic), producer.WithRetry(1))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Shutdown() }()
	wants := []string{"commit", "rollback", "check-commit", "check-rollback"}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, w := range wants {
		m := primitive.NewMessage(topic, []byte(w))
		m.WithProperty("want", w)
		res, err := p.SendMessageInTransaction(ctx, m)
		if err != nil {
			t.Fatalf("send %s: %v", w, err)
		}
		if res.Status != primitive.SendOK || res.TransactionID == "" {
			t.Fatalf("send %s: status %v transactionId %q", w, res.Status, res.TransactionID)
		}
	}
	want := []string{"check-commit", "commit"}
	deadline := time.Now().Add(15 * time.Second)
	for {
		got := txiBodies(t, addr, topic, 8)
		if slices.Equal(got, want) && l.checked("check-rollback") > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("visible %q, want %q; check-backs %v", got, want, l.checks)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Decided transactions are never checked; nothing shows up twice later.
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if got := txiBodies(t, addr, topic, 8); !slices.Equal(got, want) {
			t.Fatalf("later visible %q, want %q", got, want)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.checks["commit"] != 0 || l.checks["rollback"] != 0 || l.badPG != 0 {
		t.Errorf("check-backs %v, %d without PGROUP", l.checks, l.badPG)
	}
}
