package javatest

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/javapeer"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// TestJavaClientRequestReply runs the official Java client's request-reply
// (5.3.3 and 4.9.7) through runnel's broker: DefaultMQProducer.request()
// in one JVM, a replying push consumer (MessageUtil.createReplyMessage,
// sent to <cluster>_REPLY_TOPIC) in another. Every request must get its
// own reply, pushed by the broker to the requester
// (PUSH_REPLY_MESSAGE_TO_CLIENT), with the request's correlation id; the
// replies are also stored in the reply topic, as Java's broker stores them.
func TestJavaClientRequestReply(t *testing.T) {
	cl, c := newCluster(t)
	for _, v := range javaVersions {
		t.Run(v, func(t *testing.T) {
			t.Parallel()
			testJavaClientRequestReply(t, cl, c, v)
		})
	}
}

func testJavaClientRequestReply(t *testing.T, cl *testutil.Cluster, c *client.Client, version string) {
	d := javapeer.RequireVersion(t, version)
	dr := d.NewDriver(t)
	topic, group := uniqueName(t, "JR"), uniqueName(t, "rg")
	const count = 5
	// The topic exists before the replier subscribes: a Java consumer that
	// finds no route looks again only every 30 s.
	testutil.CreateTopic(t, c, cl.BrokerAddr, topic, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rp, err := dr.Start(ctx, cl.NameServer, "reply", "--topic", topic, "--group", group, "--count", strconv.Itoa(count),
		"--timeout-ms", "90000", "--producer-group", uniqueName(t, "rpg"))
	if err != nil {
		t.Fatal(err)
	}
	defer rp.Kill()
	if _, err := rp.Next(ctx, "started"); err != nil {
		t.Fatal(err)
	}
	// The blocking request() of 5.3.0–5.3.3 returns when the request is
	// sent, before any reply can arrive (fixed upstream after 5.3.3,
	// apache/rocketmq#9608), against any broker: 5.3.3 uses request() with
	// a RequestCallback (see the driver's request command).
	api := "sync"
	if d.Major() >= 5 {
		api = "callback"
	}
	evs := runDriver(t, dr, 2*time.Minute, cl.NameServer, "request", "--topic", topic, "--count", strconv.Itoa(count),
		"--timeout-ms", "15000", "--group", uniqueName(t, "qg"), "--prop", "color=red", "--api", api)
	var replied []javapeer.Event
	for ev := range rp.Events() {
		switch ev.Kind() {
		case "replied":
			replied = append(replied, ev)
		case "reply-error", "error", "timeout":
			t.Errorf("replier: %v", ev)
		}
	}
	if err := rp.Wait(); err != nil {
		t.Fatalf("replier: %v\n%s", err, rp.Output())
	}
	if len(replied) != count {
		t.Errorf("the replier answered %d requests, want %d", len(replied), count)
	}
	replyTopic := "DefaultCluster_REPLY_TOPIC"
	for _, ev := range replied {
		if ev.Str("reply_topic") != replyTopic || ev.Str("status") != "SEND_OK" {
			t.Errorf("reply sent to %s with status %s, want %s and SEND_OK", ev.Str("reply_topic"), ev.Str("status"), replyTopic)
		}
	}

	// The requests as stored: their correlation ids and requester.
	reqs, err := pullTopic(ctx, c, topic)
	if err != nil {
		t.Fatal(err)
	}
	corr := map[int]string{}
	var requester string
	for i := range reqs {
		m := &reqs[i]
		id, _ := m.Property(protocol.PropCorrelationID)
		to, _ := m.Property(protocol.PropReplyToClient)
		ttl, _ := m.Property(protocol.PropTTL)
		cluster, _ := m.Property(protocol.PropCluster)
		if id == "" || to == "" || ttl != "15000" || cluster != "DefaultCluster" {
			t.Errorf("request %d stored with CORRELATION_ID %q REPLY_TO_CLIENT %q TTL %q CLUSTER %q", javaI(m), id, to, ttl, cluster)
		}
		corr[javaI(m)], requester = id, to
	}
	if len(reqs) != count {
		t.Errorf("%s holds %d requests, want %d", topic, len(reqs), count)
	}

	// The replies are stored in the reply topic too.
	stored, err := pullTopic(ctx, c, replyTopic)
	if err != nil {
		t.Fatal(err)
	}
	storedReply := map[string]*protocol.MessageExt{}
	for i := range stored {
		m := &stored[i]
		id, _ := m.Property(protocol.PropCorrelationID)
		storedReply[id] = m
	}
	for n, id := range corr {
		m := storedReply[id]
		if m == nil {
			t.Errorf("%s holds no reply to request %d", replyTopic, n)
			continue
		}
		if body := fmt.Sprintf("reply:%s-%d", topic, n); string(m.Body) != body {
			t.Errorf("stored reply to %d: body %q, want %q", n, m.Body, body)
		}
	}

	replies := eventsOf(evs, "reply")
	if len(replies) != count {
		t.Fatalf("the requester got %d replies, want %d", len(replies), count)
	}
	for _, ev := range replies {
		i := int(ev.Int("i"))
		p := ev.Props()
		what := fmt.Sprintf("reply to request %d", i)
		if want := fmt.Sprintf("reply:%s-%d", topic, i); ev.Str("body") != want {
			t.Errorf("%s: body %q, want %q", what, ev.Str("body"), want)
		}
		if ev.Str("topic") != replyTopic {
			t.Errorf("%s: topic %q, want %q", what, ev.Str("topic"), replyTopic)
		}
		if ev.Str("client") != requester {
			t.Errorf("%s: requester client id %q, the request's REPLY_TO_CLIENT %q", what, ev.Str("client"), requester)
		}
		if p[protocol.PropCorrelationID] != corr[i] || p[protocol.PropReplyToClient] != requester || p[protocol.PropMsgType] != "reply" {
			t.Errorf("%s: properties %v, want CORRELATION_ID %s REPLY_TO_CLIENT %s MSG_TYPE reply", what, p, corr[i], requester)
		}
		// The header fields of PUSH_REPLY_MESSAGE_TO_CLIENT, as the
		// requester decoded them, are those of the stored reply.
		m := storedReply[corr[i]]
		if m == nil {
			continue
		}
		if int32(ev.Int("q")) != m.QueueID || ev.Int("born_ts") != m.BornTimestamp || ev.Int("store_ts") != m.StoreTimestamp ||
			ev.Str("born_host") != m.BornHost.String() || ev.Str("store_host") != m.StoreHost.String() {
			t.Errorf("%s: pushed with queue %d born %d at %s stored %d at %s; the stored reply: %d, %d at %s, %d at %s", what,
				ev.Int("q"), ev.Int("born_ts"), ev.Str("born_host"), ev.Int("store_ts"), ev.Str("store_host"),
				m.QueueID, m.BornTimestamp, m.BornHost, m.StoreTimestamp, m.StoreHost)
		}
	}
}
