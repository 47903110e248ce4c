package broker

import (
	"slices"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

func (c *subClient) lockBatch(t testing.TB, code int32, group string, mqs ...protocol.MessageQueue) []protocol.MessageQueue {
	t.Helper()
	body := protocol.LockBatchRequestBody{ConsumerGroup: group, ClientID: c.id, MQSet: mqs}
	b, err := body.Encode()
	if err != nil {
		t.Fatal(err)
	}
	req := protocol.NewRequest(code)
	req.Body = b
	resp := c.invoke(t, req)
	if resp.Code != protocol.ResSuccess {
		t.Fatalf("code %d: response %d %q", code, resp.Code, resp.Remark)
	}
	if code != protocol.ReqLockBatchMq {
		return nil
	}
	var out protocol.LockBatchResponseBody
	if err := out.Decode(resp.Body); err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(out.LockOKMQSet, protocol.MessageQueue.Compare)
	return out.LockOKMQSet
}

func TestBrokerLocks(t *testing.T) {
	subLeakCheck(t)
	clk := &subClock{}
	b := subBroker(t, t.TempDir(), clk)
	c1 := subDial(t, b, "client-1")
	c2 := subDial(t, b, "client-2")
	q := func(id int32) protocol.MessageQueue {
		return protocol.MessageQueue{Topic: "T", BrokerName: "broker-a", QueueID: id}
	}
	lock := protocol.ReqLockBatchMq

	if got := c1.lockBatch(t, lock, "g", q(0), q(1)); !slices.Equal(got, []protocol.MessageQueue{q(0), q(1)}) {
		t.Fatalf("c1 lock = %v", got)
	}
	// Contention: c2 gets only the free queue.
	if got := c2.lockBatch(t, lock, "g", q(1), q(2)); !slices.Equal(got, []protocol.MessageQueue{q(2)}) {
		t.Fatalf("c2 lock = %v, want only queue 2", got)
	}
	// Other groups are independent.
	if got := c2.lockBatch(t, lock, "g2", q(0)); !slices.Equal(got, []protocol.MessageQueue{q(0)}) {
		t.Fatalf("c2 lock in g2 = %v", got)
	}
	// Renewal by the holder keeps it alive past the original expiry.
	clk.advance(40 * time.Second)
	if got := c1.lockBatch(t, lock, "g", q(0)); !slices.Equal(got, []protocol.MessageQueue{q(0)}) {
		t.Fatalf("c1 renew = %v", got)
	}
	clk.advance(30 * time.Second) // q(1) idle 70 s: expired; q(0) renewed 30 s ago
	if got := c2.lockBatch(t, lock, "g", q(0), q(1)); !slices.Equal(got, []protocol.MessageQueue{q(1)}) {
		t.Fatalf("c2 after expiry = %v, want queue 1 taken over", got)
	}
	// Unlock releases only the caller's own locks.
	c1.lockBatch(t, protocol.ReqUnlockBatchMq, "g", q(0), q(1), q(2))
	if got := c2.lockBatch(t, lock, "g", q(0), q(1), q(2)); !slices.Equal(got, []protocol.MessageQueue{q(0), q(1), q(2)}) {
		t.Fatalf("c2 after c1 unlocked = %v", got)
	}
	if got := c1.lockBatch(t, lock, "g", q(0)); len(got) != 0 {
		t.Fatalf("c1 got a queue c2 holds: %v", got)
	}
	// Locks survive the holder's disconnect until they expire.
	_ = c2.Close()
	if got := c1.lockBatch(t, lock, "g", q(2)); len(got) != 0 {
		t.Fatalf("lock released by disconnect: %v", got)
	}
	clk.advance(61 * time.Second)
	if got := c1.lockBatch(t, lock, "g", q(2)); !slices.Equal(got, []protocol.MessageQueue{q(2)}) {
		t.Fatalf("after expiry = %v", got)
	}

	// Malformed bodies are errors, not panics.
	for _, body := range []string{"", "[]", `{"consumerGroup":"g"}`, `{"clientId":"x"}`, `{"consumerGroup":"g","clientId":"x","mqSet":[{"queueId":"x"}]}`} {
		req := protocol.NewRequest(lock)
		req.Body = []byte(body)
		if resp := c1.invoke(t, req); resp.Code != protocol.ResSystemError {
			t.Errorf("lock body %q: code %d, want SYSTEM_ERROR", body, resp.Code)
		}
	}
}
