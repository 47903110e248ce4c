package javatest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/javapeer"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// TestJavaClientBroadcastTags runs two broadcasting push consumers of one
// group of the official Java client, subscribed with a tag expression, on
// runnel's broker: each must get every message with a matching tag, once,
// and the broker must have filtered (the client filters by tag again, so
// only the broker's count of pulled messages shows it did).
func TestJavaClientBroadcastTags(t *testing.T) {
	for _, v := range []string{javapeer.Version5, javapeer.Version4} {
		t.Run(v, func(t *testing.T) { testJavaClientBroadcastTags(t, v) })
	}
}

func testJavaClientBroadcastTags(t *testing.T, version string) {
	d := javapeer.RequireVersion(t, version)
	p := startConsumePeer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	topic, group := uniqueName(t, "T"), uniqueName(t, "G")
	qs := testutil.CreateTopic(t, p.client, p.BrokerAddr, topic, 4)
	tags := []string{"a", "b", "c"}
	sent := p.sendN(t, ctx, qs, 0, 30, func(i int) string { return tags[i%3] })
	want := map[string]sentMsg{}
	for _, s := range sent {
		if s.tag != "c" {
			want[s.id] = s
		}
	}
	dr := d.NewDriver(t)
	pulled0 := p.Broker.Stats().PulledMessages
	var runs []*javaRun
	for _, name := range []string{"x", "y"} {
		runs = append(runs, startJava(t, ctx, dr, p.NameServer, name, "push", "--topic", topic, "--group", group,
			"--model", "broadcasting", "--expr", "a || b", "--count", fmt.Sprint(len(want)), "--timeout-ms", "60000",
			"--instance", name))
	}
	for _, r := range runs {
		r.wait(t)
		got := map[string]bool{}
		for _, ev := range r.okRecvs() {
			s, ok := want[ev.Str("id")]
			if !ok {
				t.Errorf("%s received %v: not a message tagged a or b", r.name, ev)
				continue
			}
			checkRecv(t, r.name, ev, s)
			if got[s.id] {
				t.Errorf("%s received message %d twice", r.name, s.i)
			}
			got[s.id] = true
		}
		if len(got) != len(want) {
			t.Errorf("%s received %d of the %d messages tagged a or b", r.name, len(got), len(want))
		}
	}
	if pulled := p.Broker.Stats().PulledMessages - pulled0; pulled != int64(2*len(want)) {
		t.Errorf("the broker returned %d messages to the two consumers' pulls, want %d (the tagged ones, twice)", pulled, 2*len(want))
	}
}

// TestJavaClientSQL92Refused subscribes the official Java client's push
// consumer with an SQL92 selector to runnel's broker, which does not filter
// by SQL92: start must fail the way it fails against a Java broker without
// enablePropertyFilter (CHECK_CLIENT_CONFIG answered SYSTEM_ERROR "The
// broker does not support consumer to filter message by SQL92").
func TestJavaClientSQL92Refused(t *testing.T) {
	d := javapeer.RequireVersion(t, javapeer.Version5)
	p := startConsumePeer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	topic := uniqueName(t, "T")
	qs := testutil.CreateTopic(t, p.client, p.BrokerAddr, topic, 1)
	p.sendN(t, ctx, qs, 0, 1, nil)
	dr := d.NewDriver(t)
	evs, err := dr.Run(ctx, p.NameServer, "push", "--topic", topic, "--group", uniqueName(t, "G"), "--sql", "i > 0",
		"--count", "1", "--timeout-ms", "20000")
	if err == nil {
		t.Fatalf("a push consumer selecting by SQL92 started and ran: %v", evs)
	}
	const want = "CODE: 1  DESC: The broker does not support consumer to filter message by SQL92"
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("push consumer with an SQL92 selector failed with\n%v\nwant an MQClientException %q", err, want)
	}
	if n := p.codes.count(protocol.ReqCheckClientConfig); n == 0 {
		t.Error("no CHECK_CLIENT_CONFIG reached the broker")
	}
}
