package javatest

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/javapeer"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// adminEnv is what TestJavaAdmin's subtests share: runnel's cluster, a
// client of it, and Apache RocketMQ's mqadmin.
type adminEnv struct {
	cl     *testutil.Cluster
	c      *client.Client
	d, d4  *javapeer.Dist // 5.3.3 and 4.9.7
	logDir string
	// trackGroup has a committed offset of the topic and no consumer.
	trackGroup string
}

// onlineOnce has a consumer of group, subscribed to topic, join and leave
// (with runnel's group consumer), as a group whose consumers are offline:
// its heartbeat creates the group and its %RETRY% topic, which mqadmin's
// consumer commands look up first.
func (e *adminEnv) onlineOnce(t *testing.T, ctx context.Context, group, topic string) {
	t.Helper()
	g, err := client.NewGroupConsumer(e.c, group)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Subscribe(topic, "*"); err != nil {
		t.Fatal(err)
	}
	if err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
}

// wantLine fails t unless some line of out matches the regular expression.
func wantLine(t *testing.T, out, what, expr string) []string {
	t.Helper()
	re := regexp.MustCompile(`(?m)` + expr)
	m := re.FindStringSubmatch(out)
	if m == nil {
		t.Errorf("%s: no line matches %q in:\n%s", what, expr, out)
	}
	return m
}

// adminAll runs the mqadmin commands concurrently (at most adminJobs at a
// time: each JVM spends seconds waiting, most of them in its client's
// shutdown) and returns their outputs in order, failing t on the first
// error.
// A command whose first argument is "4.9.7" runs 4.9.7's mqadmin.
func (e *adminEnv) adminAll(t *testing.T, cmds ...[]string) []string {
	t.Helper()
	const adminJobs = 4
	outs := make([]string, len(cmds))
	errs := make([]error, len(cmds))
	sem := make(chan struct{}, adminJobs)
	var wg sync.WaitGroup
	for i, args := range cmds {
		d := e.d
		if args[0] == javapeer.Version4 {
			d, args = e.d4, args[1:]
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			outs[i], errs[i] = d.Admin(ctx, e.logDir, e.cl.NameServer, args...)
		}()
	}
	t0 := time.Now()
	wg.Wait()
	t.Logf("%d mqadmin commands in %v", len(cmds), time.Since(t0))
	for i, args := range cmds {
		if errs[i] != nil {
			t.Fatalf("%v", errs[i])
		}
		for _, bad := range []string{"not supported", "command failed", "Exception"} {
			if strings.Contains(outs[i], bad) {
				t.Fatalf("mqadmin %s printed %q:\n%s", strings.Join(args, " "), bad, outs[i])
			}
		}
	}
	return outs
}

// TestJavaAdmin runs Apache RocketMQ 5.3.3's mqadmin (and 4.9.7's
// clusterList), as users run it
// daily, against runnel's name server and broker: updateTopic, topicRoute,
// topicStatus, topicList, clusterList, brokerStatus, consumerProgress,
// queryMsgById (by offset id and by message id), queryMsgByKey,
// resetOffsetByTime (to a time and to the end), updateSubGroup and
// deleteTopic. Every command's output is checked, and its effect verified
// with runnel's client (routes, offsets, pulls). Independent commands run
// concurrently, in three rounds.
func TestJavaAdmin(t *testing.T) {
	d := javapeer.RequireVersion(t, javapeer.Version5)
	cl, c := newCluster(t)
	e := &adminEnv{cl: cl, c: c, d: d, d4: javapeer.RequireVersion(t, javapeer.Version4), logDir: filepath.Join(t.TempDir(), "mqadmin")}
	brokerAddr := cl.Broker.AdvertisedAddr()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// Messages with keys in a topic of 4 queues, sent 20 ms apart so that
	// store times tell them apart.
	topic := uniqueName(t, "JA")
	testutil.CreateTopic(t, c, cl.BrokerAddr, topic, 4)
	p := testutil.NewProducer(t, c, uniqueName(t, "pg"))
	const n = 16
	var sent []client.SendResult
	for i := range n {
		r, err := p.Send(ctx, &client.Message{Topic: topic, Body: []byte(fmt.Sprintf("admin-%d", i)), Tags: "TA",
			Keys: []string{fmt.Sprintf("akey-%d", i)}})
		if err != nil {
			t.Fatal(err)
		}
		sent = append(sent, r)
		time.Sleep(20 * time.Millisecond)
	}
	queue := func(q int32) protocol.MessageQueue {
		return protocol.MessageQueue{Topic: topic, BrokerName: testutil.BrokerName, QueueID: q}
	}
	maxOf := func(q int32) int64 {
		off, err := c.MaxOffset(ctx, queue(q))
		if err != nil {
			t.Fatal(err)
		}
		return off
	}
	// Groups whose consumers are offline: trackGroup with an offset of
	// message 0's queue, cg with offsets of every queue.
	e.trackGroup = uniqueName(t, "JAK")
	e.onlineOnce(t, ctx, e.trackGroup, topic)
	if err := c.CommitOffset(ctx, e.trackGroup, sent[0].Queue, 1); err != nil {
		t.Fatal(err)
	}
	cg := uniqueName(t, "JAC")
	e.onlineOnce(t, ctx, cg, topic)
	committed := map[int32]int64{}
	for q := range int32(4) {
		committed[q] = int64(q % 2)
		if err := c.CommitOffset(ctx, cg, queue(q), committed[q]); err != nil {
			t.Fatal(err)
		}
	}
	nt := uniqueName(t, "JAT") // created and deleted by mqadmin
	g := uniqueName(t, "JAG")  // created by mqadmin
	s3, s5 := sent[3], sent[5]
	m8, err := pullAt(ctx, c, sent[8].Queue, sent[8].QueueOffset)
	if err != nil {
		t.Fatal(err)
	}
	ts8 := m8.StoreTimestamp

	// ---- round 1 ----
	outs := e.adminAll(t,
		[]string{"updateTopic", "-c", "DefaultCluster", "-t", nt, "-r", "3", "-w", "5", "-p", "6"},
		[]string{"clusterList"},
		[]string{"brokerStatus", "-b", brokerAddr},
		[]string{"queryMsgById", "-t", topic, "-i", s3.OffsetMsgID},
		[]string{"queryMsgById", "-t", topic, "-i", s3.MsgID},
		[]string{"queryMsgByKey", "-t", topic, "-k", "akey-5"},
		[]string{"updateSubGroup", "-c", "DefaultCluster", "-g", g, "-s", "false", "-r", "7"},
		[]string{"consumerProgress", "-g", cg},
		[]string{"topicStatus", "-t", topic},
	)

	// updateTopic: the topic's route has the queues asked for.
	wantLine(t, outs[0], "updateTopic", `^create topic to `+regexp.QuoteMeta(brokerAddr)+` success\.$`)
	testutil.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		r, err := c.RefreshRoute(ctx, nt)
		if err != nil {
			return err
		}
		if len(r.SubscribeQueues()) != 3 || len(r.PublishQueues()) != 5 {
			return fmt.Errorf("route of %s: %d read and %d write queues, want 3 and 5", nt, len(r.SubscribeQueues()), len(r.PublishQueues()))
		}
		return nil
	})

	// clusterList and brokerStatus (GET_BROKER_RUNTIME_INFO).
	wantLine(t, outs[1], "clusterList", `^DefaultCluster\s+`+testutil.BrokerName+`\s+0\s+`+regexp.QuoteMeta(brokerAddr)+`\s+V5_3_3\s+.*\s+true$`)
	out := outs[2]
	wantLine(t, out, "brokerStatus", `^brokerVersionDesc\s*: V5_3_3$`)
	wantLine(t, out, "brokerStatus", `^brokerActive\s*: true$`)
	wantLine(t, out, "brokerStatus", `^putTps\s*: \d+\.\d\d \d+\.\d\d \d+\.\d\d$`)
	wantLine(t, out, "brokerStatus", `^getTransferredTps\s*: \d+\.\d\d \d+\.\d\d \d+\.\d\d$`)
	wantLine(t, out, "brokerStatus", `^commitLogDiskRatio\s*: 0\.\d+$`)
	if m := wantLine(t, out, "brokerStatus", `^msgPutTotalTodayNow\s*: (\d+)$`); m != nil {
		if v, _ := strconv.Atoi(m[1]); v < n {
			t.Errorf("brokerStatus: msgPutTotalTodayNow %d, want at least the %d messages sent", v, n)
		}
	}
	// The earliest message is the first one sent (the broker stored no
	// other before it).
	first, err := pullAt(ctx, c, sent[0].Queue, sent[0].QueueOffset)
	if err != nil {
		t.Fatal(err)
	}
	wantLine(t, out, "brokerStatus", `^earliestMessageTimeStamp\s*: `+strconv.FormatInt(first.StoreTimestamp, 10)+`$`)

	// queryMsgById, by offset id and by message id, prints the stored
	// message; its consumption track asks QUERY_TOPIC_CONSUME_BY_WHO.
	m3, err := pullAt(ctx, c, s3.Queue, s3.QueueOffset)
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range []string{s3.OffsetMsgID, s3.MsgID} {
		out := outs[3+i]
		what := "queryMsgById " + id
		for k, v := range map[string]string{
			"OffsetID": s3.OffsetMsgID, "Topic": topic, "Tags": `\[TA\]`, "Keys": `\[akey-3\]`,
			"Queue ID": strconv.Itoa(int(s3.Queue.QueueID)), "Queue Offset": strconv.FormatInt(s3.QueueOffset, 10),
			"CommitLog Offset": strconv.FormatInt(m3.CommitLogOffset, 10), "Store Host": regexp.QuoteMeta(brokerAddr),
			"Born Host": regexp.QuoteMeta(m3.BornHost.String()),
		} {
			wantLine(t, out, what, `^`+k+`:\s+`+v+`$`)
		}
		wantLine(t, out, what, `^Properties:\s+\{.*UNIQ_KEY=`+s3.MsgID)
		for _, grp := range []string{e.trackGroup, cg} {
			wantLine(t, out, what, `^MessageTrack \[consumerGroup=`+grp+`, trackType=NOT_ONLINE`)
		}
	}

	// queryMsgByKey: exactly the message with that key.
	wantLine(t, outs[5], "queryMsgByKey", fmt.Sprintf(`^%s\s+%d\s+%d$`, s5.MsgID, s5.Queue.QueueID, s5.QueueOffset))
	if got := regexp.MustCompile(`(?m)^[0-9A-F]{32}\s+\d+\s+\d+$`).FindAllString(outs[5], -1); len(got) != 1 {
		t.Errorf("queryMsgByKey akey-5: want exactly one message (%s), got:\n%s", s5.MsgID, outs[5])
	}

	// updateSubGroup: a group that may not consume; a pull by it is
	// refused with NO_PERMISSION, as Java's broker refuses it.
	wantLine(t, outs[6], "updateSubGroup", `^create subscription group to `+regexp.QuoteMeta(brokerAddr)+` success\.$`)
	_, err = c.Pull(ctx, client.PullRequest{Queue: sent[0].Queue, Group: g})
	if pe := (*protocol.Error)(nil); !errors.As(err, &pe) || pe.Code != protocol.ResNoPermission {
		t.Errorf("pull by group %s created with consumeEnable=false: %v, want NO_PERMISSION", g, err)
	}

	// consumerProgress: the group's committed offsets against the queues'.
	var diff int64
	for q := range int32(4) {
		mx := maxOf(q)
		diff += mx - committed[q]
		wantLine(t, outs[7], "consumerProgress", fmt.Sprintf(`^%s\s+%s\s+%d\s+%d\s+%d\s+%d\s`, topic, testutil.BrokerName, q, mx, committed[q], mx-committed[q]))
	}
	wantLine(t, outs[7], "consumerProgress", fmt.Sprintf(`^Consume Diff Total: %d$`, diff))

	// topicStatus: per queue, the min and max offsets runnel's client
	// reads, and the last store time.
	for q := range int32(4) {
		minOff, err := c.MinOffset(ctx, queue(q))
		if err != nil {
			t.Fatal(err)
		}
		wantLine(t, outs[8], "topicStatus", fmt.Sprintf(`^%s\s+%d\s+%d\s+%d\s+\d{4}-\d\d-\d\d `, testutil.BrokerName, q, minOff, maxOf(q)))
	}

	// ---- round 2 ----
	outs = e.adminAll(t,
		[]string{javapeer.Version4, "clusterList"},
		[]string{"topicRoute", "-t", nt},
		[]string{"topicList"},
		[]string{"updateSubGroup", "-c", "DefaultCluster", "-g", g, "-s", "true"},
		[]string{"resetOffsetByTime", "-g", cg, "-t", topic, "-s", strconv.FormatInt(ts8, 10)},
	)
	// 4.x's clusterList reads the 4.x key of the get rate.
	wantLine(t, outs[0], "clusterList (4.9.7)", `^DefaultCluster\s+`+testutil.BrokerName+`\s+0\s+`+regexp.QuoteMeta(brokerAddr)+`\s+V5_3_3\s+\d`)
	outs = outs[1:]
	for _, l := range []string{`"brokerName":\s*"` + testutil.BrokerName + `"`, `"readQueueNums":\s*3`, `"writeQueueNums":\s*5`,
		`"perm":\s*6`, `"cluster":\s*"DefaultCluster"`, `0:\s*"` + regexp.QuoteMeta(brokerAddr) + `"`} {
		wantLine(t, outs[0], "topicRoute", l)
	}
	wantLine(t, outs[1], "topicList", `^`+nt+`$`)
	wantLine(t, outs[1], "topicList", `^`+topic+`$`)
	wantLine(t, outs[2], "updateSubGroup", `consumeEnable=true`)
	if _, err := c.Pull(ctx, client.PullRequest{Queue: sent[0].Queue, Group: g}); err != nil {
		t.Errorf("pull by group %s after consumeEnable=true: %v", g, err)
	}
	// resetOffsetByTime to the store time of message 8: each queue's
	// offset becomes its first message stored at or after it.
	for q := range int32(4) {
		want, err := c.SearchOffset(ctx, queue(q), time.UnixMilli(ts8))
		if err != nil {
			t.Fatal(err)
		}
		wantLine(t, outs[3], "resetOffsetByTime", fmt.Sprintf(`^%s\s+%d\s+%d\s*$`, testutil.BrokerName, q, want))
		got, err := c.QueryConsumerOffset(ctx, cg, queue(q))
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("after resetOffsetByTime to %d, group %s's offset of queue %d is %d, want %d", ts8, cg, q, got, want)
		}
	}
	if got, _ := c.QueryConsumerOffset(ctx, cg, sent[8].Queue); got != sent[8].QueueOffset {
		t.Errorf("after resetOffsetByTime to message 8's store time, its queue's offset is %d, want %d", got, sent[8].QueueOffset)
	}

	// ---- round 3 ----
	outs = e.adminAll(t,
		[]string{"deleteTopic", "-c", "DefaultCluster", "-t", nt},
		[]string{"resetOffsetByTime", "-g", cg, "-t", topic, "-s", "-1"},
	)
	wantLine(t, outs[0], "deleteTopic", `^delete topic \[`+nt+`\] from cluster \[DefaultCluster\] success\.$`)
	wantLine(t, outs[0], "deleteTopic", `^delete topic \[`+nt+`\] from NameServer success\.$`)
	topics, err := c.ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(topics, nt) {
		t.Errorf("topic %s still listed by the name server after deleteTopic", nt)
	}
	if _, err := c.RefreshRoute(ctx, nt); err == nil {
		t.Errorf("topic %s still has a route after deleteTopic", nt)
	}
	// resetOffsetByTime -1: every queue's end.
	for q := range int32(4) {
		got, err := c.QueryConsumerOffset(ctx, cg, queue(q))
		if err != nil {
			t.Fatal(err)
		}
		if mx := maxOf(q); got != mx {
			t.Errorf("after resetOffsetByTime -1, queue %d's offset is %d, want its end %d", q, got, mx)
		}
		wantLine(t, outs[1], "resetOffsetByTime -1", fmt.Sprintf(`^%s\s+%d\s+%d\s*$`, testutil.BrokerName, q, maxOf(q)))
	}
}
