package rocketmq

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/broker"
)

// TestExactlyOnceRefusesHalfWithoutSlave: a SYNC_MASTER without a slave
// stores every half message but answers SLAVE_NOT_AVAILABLE. The sink
// treats such a half message as Apache RocketMQ's transactional producer
// does: it rolls it back and sends the record again, and, the slave never
// coming, fails the epoch loudly within its retries; nothing becomes
// visible. (Accepting them, as the sink did, committed output that was on
// one machine while the broker is configured to promise two.)
func TestExactlyOnceRefusesHalfWithoutSlave(t *testing.T) {
	cl := newCluster(t, broker.WithRole(broker.RoleSyncMaster), broker.WithHAListenAddr("127.0.0.1:0"))
	cl.createTopic("eo_noslave", 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := newEO(t, cl, TxGroup("job", "noslave"), "eo_noslave")
	defer s.Close()
	if err := s.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	const n = 4
	for i := range n {
		if err := s.Write(ctx, keyed{Key: "k", Seq: i}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := s.PreCommit(ctx, 1)
	if !errors.Is(err, errNotStoredWell) || !strings.Contains(err.Error(), "SLAVE_NOT_AVAILABLE") || !strings.Contains(err.Error(), "failed after 3 attempts") {
		t.Fatalf("PreCommit on a SYNC_MASTER without a slave: %v", err)
	}
	// Every stored half message (3 attempts of each record) rolled back,
	// none committed, nothing visible.
	waitFor(t, "the stored half messages to be rolled back", 10*time.Second, func() bool {
		st := cl.b.TransactionStats()
		return st.Prepared == 3*n && st.RolledBack == 3*n
	})
	if st := cl.b.TransactionStats(); st.Committed != 0 {
		t.Fatalf("transactions %+v: committed half messages stored without their slave", st)
	}
	if got := cl.readTopic("eo_noslave"); len(got) != 0 {
		t.Fatalf("%d records visible", len(got))
	}
}
