package javatest

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/javapeer"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// TestJavaClientRetryDLQ runs two groups of the official Java client's
// concurrent push consumer on one topic of runnel's broker, each failing
// every message K = 3 times (RECONSUME_LATER): group "retry" with max
// reconsume times 5 sees each message redelivered with reconsume times 1,
// 2, 3, each after its delay level (3 + reconsume times) and then
// consumes it; group "dlq" with max reconsume times 1 sees each message
// twice, after which the broker puts it in %DLQ%dlq with its original
// properties, and it is not delivered again. Every failure goes back
// through CONSUMER_SEND_MSG_BACK (the client falls back to sending to
// %RETRY% itself only when that fails).
func TestJavaClientRetryDLQ(t *testing.T) {
	for _, v := range []string{javapeer.Version5, javapeer.Version4} {
		t.Run(v, func(t *testing.T) {
			// Only lower bounds on time (delay levels): load does not
			// make it fail, so the versions run side by side.
			t.Parallel()
			testJavaClientRetryDLQ(t, v)
		})
	}
}

func testJavaClientRetryDLQ(t *testing.T, version string) {
	d := javapeer.RequireVersion(t, version)
	p := startConsumePeer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	topic := uniqueName(t, "T")
	retryGroup, dlqGroup := uniqueName(t, "Gretry"), uniqueName(t, "Gdlq")
	qs := testutil.CreateTopic(t, p.client, p.BrokerAddr, topic, 2)
	const n, failTimes = 6, 3
	sent := p.sendN(t, ctx, qs, 0, n-1, func(i int) string { return "r" })
	// One of them large enough to be compressed by the producer: the
	// copies the broker stores on send-back keep body and flag as stored.
	big, err := p.sendBody(ctx, qs[0], n-1, "r", nil, []byte(strings.Repeat("compressible body ", 600)))
	if err != nil {
		t.Fatal(err)
	}
	sent = append(sent, big)
	ids := bySent(sent)
	dr := d.NewDriver(t)
	// A new group's first rebalance finds no route of %RETRY%<group> yet
	// (the broker creates that topic on the group's first heartbeat, which
	// comes after the client's route lookups): the official client pulls
	// retries only from its next rebalance, 20 s later by default, against
	// Apache RocketMQ's broker too. --rebalance-ms shortens that period.
	common := []string{"--topic", topic, "--count", "0", "--timeout-ms", "90000", "--fail-times", strconv.Itoa(failTimes),
		"--rebalance-ms", "1000"}
	retry := startJava(t, ctx, dr, p.NameServer, "retry", "push", append(common, "--group", retryGroup, "--max-reconsume", "5")...)
	dlq := startJava(t, ctx, dr, p.NameServer, "dlq", "push", append(common, "--group", dlqGroup, "--max-reconsume", "1")...)
	dlqQ := protocol.MessageQueue{Topic: "%DLQ%" + dlqGroup, BrokerName: testutil.BrokerName, QueueID: 0}

	testutil.CheckFor(t, 60*time.Second, 50*time.Millisecond, func() error {
		if err := retry.failed(); err != nil {
			t.Fatal(err)
		}
		if got := len(retry.okRecvs()); got < n {
			return fmt.Errorf("group retry consumed %d of %d messages", got, n)
		}
		return nil
	})
	var dead []protocol.MessageExt
	testutil.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		if err := dlq.failed(); err != nil {
			t.Fatal(err)
		}
		var err error
		if dead, err = p.tryPullAll(ctx, dlqQ); err != nil {
			if errors.Is(err, protocol.ErrTopicNotExist) {
				return err // created, not yet on the name server
			}
			t.Fatal(err)
		}
		if len(dead) < n {
			return fmt.Errorf("%d of %d messages in %s", len(dead), n, dlqQ.Topic)
		}
		return nil
	})
	// Long enough for one more retry (level 3 + 1) to come, were one
	// scheduled.
	time.Sleep(3 * consumeDelayLevel * 4)
	stopAll(t, retry, dlq)

	// group retry: reconsume times 0..K, in order, each retry after its
	// delay level, the last one consumed.
	checkRetries := func(r *javaRun, deliveries int) {
		t.Helper()
		byID := map[string][]javapeer.Event{}
		for _, ev := range r.kind("recv") {
			s, ok := ids[ev.Str("id")]
			if !ok {
				t.Errorf("%s received a message that was not sent: %v", r.name, ev)
				continue
			}
			checkRecv(t, r.name, ev, s)
			byID[s.id] = append(byID[s.id], ev)
		}
		for _, s := range sent {
			evs := byID[s.id]
			sort.Slice(evs, func(i, j int) bool { return evs[i].Int("t_ns") < evs[j].Int("t_ns") })
			if len(evs) != deliveries {
				t.Errorf("%s: message %d delivered %d times, want %d", r.name, s.i, len(evs), deliveries)
				continue
			}
			for j, ev := range evs {
				if ev.Int("reconsume") != int64(j) {
					t.Errorf("%s: delivery %d of message %d has reconsume times %d, want %d", r.name, j+1, s.i, ev.Int("reconsume"), j)
				}
				if j == 0 {
					continue
				}
				// What a Java broker's send-back adds to the copy.
				if pr := ev.Props(); pr["RETRY_TOPIC"] != topic || pr["WAIT"] != "false" || pr["ORIGIN_MESSAGE_ID"] != s.offID {
					t.Errorf("%s: redelivery of message %d, want RETRY_TOPIC=%s WAIT=false ORIGIN_MESSAGE_ID=%s: %v", r.name, s.i, topic, s.offID, pr)
				}
				gap := time.Duration(ev.Int("t_ns") - evs[j-1].Int("t_ns"))
				if level := time.Duration(3+j-1) * consumeDelayLevel; gap < level*9/10 {
					t.Errorf("%s: message %d redelivered %v after delivery %d, before its delay level (%v)", r.name, s.i, gap, j, level)
				}
			}
		}
	}
	checkRetries(retry, failTimes+1)
	checkRetries(dlq, 2)

	if got, want := p.codes.count(protocol.ReqConsumerSendMsgBack), n*failTimes+n*2; got != want {
		t.Errorf("%d CONSUMER_SEND_MSG_BACK requests, want %d", got, want)
	}
	for _, g := range []string{retryGroup, dlqGroup} {
		if got := p.codes.sendsTo("%RETRY%" + g); got != 0 {
			t.Errorf("%d messages sent to %%RETRY%%%s by the client: a send-back failed", got, g)
		}
		// The retries were consumed and committed like any queue's.
		rq := []protocol.MessageQueue{{Topic: "%RETRY%" + g, BrokerName: testutil.BrokerName, QueueID: 0}}
		if ends, off := p.maxOffsets(t, ctx, rq), p.brokerOffsets(t, ctx, g, rq); !mapsEqual(ends, off) || ends[0] == 0 {
			t.Errorf("%%RETRY%%%s: committed offset %v, want its end %v", g, off, ends)
		}
	}

	// The dead letters: each message once, intact, with its origin.
	if len(dead) != n {
		t.Fatalf("%d messages in %s, want %d", len(dead), dlqQ.Topic, n)
	}
	for _, m := range dead {
		s, ok := ids[m.MsgID()]
		if !ok {
			t.Errorf("dead letter %s is none of the sent messages", m.MsgID())
			continue
		}
		delete(ids, s.id)
		checkDead(t, m, s, topic)
		if v, _ := m.Property("ORIGIN_MESSAGE_ID"); v != s.offID {
			t.Errorf("dead letter of message %d: ORIGIN_MESSAGE_ID %q, want the original's offset message id %s", s.i, v, s.offID)
		}
		if v, _ := m.Property("WAIT"); v != "false" {
			t.Errorf("dead letter of message %d: WAIT %q, want false (as a Java broker's send-back stores it)", s.i, v)
		}
		if m.Topic != dlqQ.Topic || m.ReconsumeTimes != 2 {
			t.Errorf("dead letter of message %d: topic %s reconsume times %d, want %s and 2", s.i, m.Topic, m.ReconsumeTimes, dlqQ.Topic)
		}
	}
}
