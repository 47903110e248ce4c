package javatest

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/javapeer"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// txClasses are the transactions TestJavaClientTransaction runs: message i
// is of class i % len(txClasses), with executeLocalTransaction's answer
// and the answers of its check-backs (in order; the last repeats).
var txClasses = []struct {
	local, check string
	committed    bool
	minChecks    int
}{
	{"commit", "commit", true, 0},
	{"rollback", "commit", false, 0},
	{"unknown", "commit", true, 1},
	{"unknown", "rollback", false, 1},
	{"unknown", "unknown>commit", true, 2},
}

// TestJavaClientTransaction runs the official Java TransactionMQProducer
// (5.3.3 and 4.9.7) against runnel's broker, with its check-back interval
// and transaction timeout shortened: a local commit is visible at once, a
// local rollback never, and an unknown local state is resolved by the
// broker's CHECK_TRANSACTION_STATE, answered by the Java producer's
// checkLocalTransaction with commit, with rollback, or with unknown first
// and commit on a later check-back. It checks the check-back message as
// Java decodes it (real topic and queue, TRAN_MSG, PGROUP, transaction id),
// that no ended transaction is checked back, and the committed messages as
// Java's broker stores them (commit sysflag, prepared offset = the half
// message's commit-log offset, REAL_* and TRAN_MSG gone).
func TestJavaClientTransaction(t *testing.T) {
	const interval, timeout = 300 * time.Millisecond, time.Second
	cl, c := newCluster(t, broker.WithTransactionCheckInterval(interval), broker.WithTransactionTimeout(timeout))
	const count = 10
	t.Run("versions", func(t *testing.T) {
		for _, v := range javaVersions {
			t.Run(v, func(t *testing.T) {
				t.Parallel()
				testJavaClientTransaction(t, cl, c, v, count)
			})
		}
	})
	if t.Failed() {
		return
	}
	// Every half message ended once: no repeated or missing outcome, and
	// nothing is checked back any more.
	var committed, rolledBack int64
	for i := range count {
		if txClasses[i%len(txClasses)].committed {
			committed++
		} else {
			rolledBack++
		}
	}
	n := int64(len(javaVersions))
	st := cl.Broker.TransactionStats()
	if st.Prepared != n*count || st.Committed != n*committed || st.RolledBack != n*rolledBack || st.Discarded != 0 {
		t.Errorf("broker transaction stats %+v, want %d prepared, %d committed, %d rolled back, none discarded", st, n*count, n*committed, n*rolledBack)
	}
	time.Sleep(4 * interval) // several check rounds, to see none sends a check-back
	if st2 := cl.Broker.TransactionStats(); st2.CheckBacks != st.CheckBacks {
		t.Errorf("the broker sent %d more check-backs after every transaction ended", st2.CheckBacks-st.CheckBacks)
	}
}

func testJavaClientTransaction(t *testing.T, cl *testutil.Cluster, c *client.Client, version string, count int) {
	d := javapeer.RequireVersion(t, version)
	dr := d.NewDriver(t)
	topic, group := uniqueName(t, "JT"), uniqueName(t, "txg")
	var local, check string
	for i, k := range txClasses {
		if i > 0 {
			local, check = local+",", check+","
		}
		local, check = local+k.local, check+k.check
	}
	evs := runDriver(t, dr, 2*time.Minute, cl.NameServer, "tx", "--topic", topic, "--group", group, "--count", strconv.Itoa(count),
		"--local", local, "--check", check, "--linger-ms", "60000", "--until-resolved", "true",
		"--tag", "TagT", "--keys", "txkey-", "--prop", "color=green")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sent := map[int]sentMsg{}
	txOf := map[int]string{}
	for _, ev := range eventsOf(evs, "sent") {
		ms, err := sentMessages(ev)
		if err != nil {
			t.Fatal(err)
		}
		s := ms[0]
		sent[s.i] = s
		txOf[s.i] = ev.Str("tx")
		k := txClasses[s.i%len(txClasses)]
		wantLocal := map[string]string{"commit": "COMMIT_MESSAGE", "rollback": "ROLLBACK_MESSAGE", "unknown": "UNKNOW"}[k.local]
		if ev.Str("local") != wantLocal || ev.Str("tx") != s.id {
			t.Errorf("transaction %d: local state %s transaction id %q, want %s and the message id %s", s.i, ev.Str("local"), ev.Str("tx"), wantLocal, s.id)
		}
	}
	if len(sent) != count {
		t.Fatalf("the driver reported %d transactional sends, want %d", len(sent), count)
	}

	// The send result's queue offset is the half message's, in queue 0 of
	// RMQ_SYS_TRANS_HALF_TOPIC (as Java's broker answers).
	halfOff := map[int]int64{}
	for i, s := range sent {
		m, err := pullAt(ctx, c, protocol.MessageQueue{Topic: "RMQ_SYS_TRANS_HALF_TOPIC", BrokerName: testutil.BrokerName}, s.qoff)
		if err != nil {
			t.Errorf("transaction %d: half message at the send result's offset: %v", i, err)
			continue
		}
		if m.UniqKey() != s.id || javaI(&m) != i {
			t.Errorf("transaction %d: the half queue offset %d of its send result holds message %d (%s)", i, s.qoff, javaI(&m), m.UniqKey())
		}
		halfOff[i] = m.CommitLogOffset
	}

	checks := map[int]int{}
	for _, ev := range eventsOf(evs, "check") {
		i, _ := strconv.Atoi(ev.Str("i"))
		s, ok := sent[i]
		if !ok {
			t.Errorf("check-back of an unknown message: %v", ev)
			continue
		}
		checks[i]++
		p := ev.Props()
		what := fmt.Sprintf("check-back %d of transaction %d", ev.Int("n"), i)
		if ev.Str("topic") != topic || int32(ev.Int("q")) != s.q || ev.Str("tx") != txOf[i] {
			t.Errorf("%s: Java sees topic %s queue %d transaction %q, want %s %d %q", what, ev.Str("topic"), ev.Int("q"), ev.Str("tx"), topic, s.q, txOf[i])
		}
		if p["TRAN_MSG"] != "true" || p["PGROUP"] != group || p["UNIQ_KEY"] != s.id || p["color"] != "green" || ev.Str("tags") != "TagT" {
			t.Errorf("%s: properties %v, want TRAN_MSG=true PGROUP=%s UNIQ_KEY=%s color=green TAGS=TagT", what, p, group, s.id)
		}
		if want := fmt.Sprintf("%s-%d", topic, i); ev.Str("body") != want {
			t.Errorf("%s: body %q, want %q", what, ev.Str("body"), want)
		}
		if !loopback(ev.Str("born_host")) || ev.Int("born_ts") < s.t0 || ev.Int("born_ts") > s.t1 {
			t.Errorf("%s: born %d at %s, want within the send [%d, %d] on loopback", what, ev.Int("born_ts"), ev.Str("born_host"), s.t0, s.t1)
		}
	}
	t.Logf("%d check-backs answered by the Java producer", len(eventsOf(evs, "check")))
	for i := range count {
		k := txClasses[i%len(txClasses)]
		if k.minChecks == 0 && checks[i] > 0 {
			t.Errorf("transaction %d (local %s) was checked back %d times after it ended", i, k.local, checks[i])
		}
		if checks[i] < k.minChecks {
			t.Errorf("transaction %d (local %s, checks %s) was checked back %d times, want at least %d", i, k.local, k.check, checks[i], k.minChecks)
		}
	}

	// The committed messages become visible (the producer's last
	// END_TRANSACTION is one-way); the rolled-back ones never do.
	want := 0
	for i := range count {
		if txClasses[i%len(txClasses)].committed {
			want++
		}
	}
	var got []protocol.MessageExt
	testutil.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		var err error
		if got, err = pullTopic(ctx, c, topic); err != nil {
			return err
		}
		if len(got) < want {
			return fmt.Errorf("%d of %d committed messages visible in %s", len(got), want, topic)
		}
		return nil
	})
	seen := map[int]int{}
	for i := range got {
		m := &got[i]
		n := javaI(m)
		seen[n]++
		s, ok := sent[n]
		if !ok {
			t.Errorf("unexpected message in %s: %q", topic, m.Properties)
			continue
		}
		what := fmt.Sprintf("committed message %d", n)
		if !txClasses[n%len(txClasses)].committed {
			t.Errorf("rolled-back transaction %d is visible at %d/%d", n, m.QueueID, m.QueueOffset)
			continue
		}
		if m.QueueID != s.q || string(m.Body) != fmt.Sprintf("%s-%d", topic, n) || m.Tags() != "TagT" || m.Keys() != "txkey-"+strconv.Itoa(n) {
			t.Errorf("%s: queue %d body %q tags %q keys %q, want queue %d", what, m.QueueID, m.Body, m.Tags(), m.Keys(), s.q)
		}
		if protocol.TransactionType(m.SysFlag) != protocol.SysFlagTransactionCommit {
			t.Errorf("%s: sysflag %#x, want the commit type", what, m.SysFlag)
		}
		if m.PreparedTransactionOffset != halfOff[n] {
			t.Errorf("%s: prepared transaction offset %d, want the half message's commit-log offset %d", what, m.PreparedTransactionOffset, halfOff[n])
		}
		for _, k := range []string{protocol.PropTransactionPrepared, protocol.PropRealTopic, protocol.PropRealQueueID} {
			if v, ok := m.Property(k); ok {
				t.Errorf("%s: property %s=%q left on the committed message", what, k, v)
			}
		}
		for k, v := range map[string]string{protocol.PropProducerGroup: group, protocol.PropUniqKey: s.id, "color": "green"} {
			if got, _ := m.Property(k); got != v {
				t.Errorf("%s: property %s=%q, want %q", what, k, got, v)
			}
		}
		if m.BornTimestamp < s.t0 || m.BornTimestamp > s.t1 || m.StoreTimestamp < m.BornTimestamp || !loopback(m.BornHost.String()) {
			t.Errorf("%s: born %d at %s stored %d, want born in [%d, %d]", what, m.BornTimestamp, m.BornHost, m.StoreTimestamp, s.t0, s.t1)
		}
		if m.StoreHost.String() != cl.Broker.AdvertisedAddr() {
			t.Errorf("%s: store host %s, want %s", what, m.StoreHost, cl.Broker.AdvertisedAddr())
		}
	}
	for n, c := range seen {
		if c != 1 {
			t.Errorf("message %d visible %d times", n, c)
		}
	}
}
