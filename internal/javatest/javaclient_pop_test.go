package javatest

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/javapeer"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// TestJavaClientPop runs the official Java 5.3.3 push consumer in POP mode
// (setClientRebalance(false)) against runnel's broker. The real mqadmin
// sets the group's mode on the topic (setConsumeMode -m POP:
// SET_MESSAGE_REQUEST_MODE), so the client's QUERY_ASSIGNMENT gets queue
// -1 in POP mode and pops instead of pulling. A first consumer pops the
// messages and hangs in its listener; it is killed (SIGKILL) and a second
// consumer must get them again once their invisible time passed, revived
// through %RETRY%<group>_<topic> with reconsume times 1 and the original
// topic. Messages sent after the kill that the listener fails once go back
// by CHANGE_MESSAGE_INVISIBLETIME (the client's popDelayLevel, 10 s) and
// come again with reconsume times 1. Every message is consumed, acked
// (ACK_MESSAGE), and none comes back after its ack.
func TestJavaClientPop(t *testing.T) {
	d := javapeer.RequireVersion(t, javapeer.Version5)
	p := startConsumePeer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	topic, group := uniqueName(t, "TP"), uniqueName(t, "Gpop")
	qs := testutil.CreateTopic(t, p.client, p.BrokerAddr, topic, 2)
	createGroup(t, ctx, p.BrokerAddr, group)
	out, err := d.Admin(ctx, filepath.Join(t.TempDir(), "admin"), p.NameServer, "setConsumeMode", "-c", "DefaultCluster",
		"-t", topic, "-g", group, "-m", "POP", "-q", "-1")
	if err != nil || !strings.Contains(out, "success") {
		t.Fatalf("mqadmin setConsumeMode: %v\n%s", err, out)
	}
	if p.codes.count(protocol.ReqSetMessageRequestMode) == 0 {
		t.Fatal("mqadmin sent no SET_MESSAGE_REQUEST_MODE")
	}

	const held, failing = 6, 3
	first := bySent(p.sendN(t, ctx, qs, 0, held, nil))
	dr := d.NewDriver(t)
	common := []string{"--topic", topic, "--group", group, "--pop", "true", "--pop-invisible-ms", "5000", "--timeout-ms", "120000"}
	holder := startJava(t, ctx, dr, p.NameServer, "holder", "push", append(common, "--count", "0", "--sleep-ms", "600000")...)
	holder.waitStarted(t)
	testutil.CheckFor(t, 60*time.Second, 20*time.Millisecond, func() error {
		if err := holder.failed(); err != nil {
			t.Fatal(err)
		}
		if n := len(holder.kind("recv")); n < held {
			return fmt.Errorf("the holder received %d of %d messages", n, held)
		}
		return nil
	})
	heldAt := time.Now()
	holderGot := map[string]bool{}
	for _, ev := range holder.kind("recv") {
		holderGot[ev.Str("id")] = true
		if ev.Int("reconsume") != 0 || ev.Props()[protocol.PropPopCK] == "" {
			t.Errorf("holder: first delivery %v: want reconsume 0 and a POP_CK receipt handle", ev)
		}
	}
	holder.kill()
	// The group's %RETRY% topic is pulled, as a Java broker assigns it
	// (QueryAssignmentProcessor: "retry topic must be pull mode").
	if p.codes.count(protocol.ReqQueryAssignment) == 0 || p.codes.count(protocol.ReqPopMessage) == 0 || p.codes.pullsOf(topic) != 0 {
		t.Fatalf("the holder sent %d QUERY_ASSIGNMENT, %d POP_MESSAGE, %d PULL_MESSAGE of %s; want pops, no pulls",
			p.codes.count(protocol.ReqQueryAssignment), p.codes.count(protocol.ReqPopMessage), p.codes.pullsOf(topic), topic)
	}

	later := map[string]fedMsg{}
	for i := held; i < held+failing; i++ {
		m, err := p.sendOne(ctx, qs[i%len(qs)], i, "", map[string]string{"javapeer_fail": "true"})
		if err != nil {
			t.Fatal(err)
		}
		later[m.id] = m
	}
	all := map[string]fedMsg{}
	for id, s := range first {
		all[id] = s
	}
	for id, s := range later {
		all[id] = s
	}
	consumer := startJava(t, ctx, dr, p.NameServer, "consumer", "push",
		append(common, "--count", fmt.Sprint(held+failing), "--fail-times", "1", "--fail-prop", "javapeer_fail")...)
	consumer.wait(t)

	deliveries := map[string][]javapeer.Event{}
	for _, ev := range consumer.kind("recv") {
		s, ok := all[ev.Str("id")]
		if !ok {
			t.Errorf("consumer received a message never sent: %v", ev)
			continue
		}
		checkRecv(t, "consumer", ev, s)
		deliveries[s.id] = append(deliveries[s.id], ev)
	}
	for id, s := range first {
		evs := deliveries[id]
		if len(evs) != 1 {
			t.Errorf("message %d delivered %d times to the consumer, want once: %v", s.i, len(evs), evs)
			continue
		}
		if ev := evs[0]; ev.Int("reconsume") != 1 || time.UnixMilli(ev.Int("t_ms")).Before(heldAt.Add(4*time.Second)) {
			t.Errorf("message %d, held by the killed consumer: redelivered %v; want reconsume 1 after its invisible time", s.i, ev)
		}
	}
	for id, s := range later {
		evs := deliveries[id]
		if len(evs) != 2 {
			t.Errorf("failed message %d delivered %d times, want twice: %v", s.i, len(evs), evs)
			continue
		}
		a, b := evs[0], evs[1]
		if a.Int("reconsume") != 0 || b.Int("reconsume") != 1 || b.Int("t_ms")-a.Int("t_ms") < 9000 {
			t.Errorf("failed message %d: deliveries %v then %v; want reconsume 0, then 1 after the 10 s of popDelayLevel", s.i, a, b)
		}
	}
	if p.codes.count(protocol.ReqChangeMessageInvisibleTime) < failing {
		t.Errorf("%d CHANGE_MESSAGE_INVISIBLETIME, want one per failed delivery (%d)", p.codes.count(protocol.ReqChangeMessageInvisibleTime), failing)
	}
	if p.codes.count(protocol.ReqAckMessage)+p.codes.count(protocol.ReqBatchAckMessage) == 0 {
		t.Error("no ACK_MESSAGE or BATCH_ACK_MESSAGE reached the broker")
	}
}

// createGroup creates a subscription group on runnel's broker
// (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP), as mqadmin updateSubGroup does.
func createGroup(t *testing.T, ctx context.Context, brokerAddr, group string) {
	t.Helper()
	conn, err := remoting.Dial(ctx, brokerAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := protocol.NewRequest(protocol.ReqUpdateAndCreateSubscriptionGroup)
	req.Body = fmt.Appendf(nil, `{"groupName":%q,"consumeEnable":true,"retryQueueNums":1,"retryMaxTimes":16}`, group)
	resp, err := conn.Invoke(ctx, req)
	if err != nil || resp.Code != protocol.ResSuccess {
		t.Fatalf("create group %s: %v %+v", group, err, resp)
	}
}
