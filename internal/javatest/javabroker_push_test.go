package javatest

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/javapeer"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// TestJavaBrokerPushConsumer runs runnel's PushConsumer against Apache
// RocketMQ's broker (5.3.3 and 4.9.7, the shared clusters, property filter
// on): subscribed with an SQL92 selector it gets exactly the selected
// messages, the Java broker filtering; a message its handler fails once
// goes back with CONSUMER_SEND_MSG_BACK (delay level 1) and comes again
// through %RETRY%<group> with reconsume times 1 and its original topic.
// Then request-reply: runnel's producer's Request gets the reply another
// runnel push consumer sends with NewReplyMessage, pushed by the Java
// broker (PUSH_REPLY_MESSAGE_TO_CLIENT) and matched by correlation id.
func TestJavaBrokerPushConsumer(t *testing.T) {
	eachBrokerParallel(t, func(t *testing.T, d *javapeer.Dist, c *javapeer.Cluster) {
		ctx := bg(t, 2*time.Minute)
		cl := newJavaClient(t, c)
		topic := uniqueName(t, "push")
		qs := createJavaTopic(t, cl, c, topic, 2)
		p := newJavaProducer(t, cl, uniqueName(t, "pg"))
		const n = 10
		for i := range n {
			m := &client.Message{Topic: topic, Body: fmt.Appendf(nil, "m%d", i), Queue: &qs[i%2],
				Properties: map[string]string{"i": strconv.Itoa(i)}}
			if _, err := p.Send(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
		var mu sync.Mutex
		got := map[int][]int32{} // i → reconsume times of each delivery
		h := client.ConcurrentHandler(func(_ context.Context, msgs []*client.ConsumedMessage) error {
			mu.Lock()
			defer mu.Unlock()
			for _, m := range msgs {
				v, _ := m.Property("i")
				i, _ := strconv.Atoi(v)
				if m.Topic != topic || string(m.Body) != fmt.Sprint("m", i) {
					t.Errorf("delivered %s %q as message %d", m.Topic, m.Body, i)
				}
				got[i] = append(got[i], m.ReconsumeTimes)
				if i == 3 && m.ReconsumeTimes == 0 {
					m.Result, m.DelayLevel = client.ConsumeRetryLater, 1
				}
			}
			return nil
		})
		pc, err := client.NewPushConsumer(cl, uniqueName(t, "g"), h, client.WithConsumeFrom(client.ConsumeFromFirst))
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		if err := pc.Subscribe(topic, client.BySQL92("i >= 2 AND i <> 5")); err != nil {
			t.Fatal(err)
		}
		if err := pc.Start(ctx); err != nil {
			t.Fatal(err)
		}
		want := map[int][]int32{}
		for i := 2; i < n; i++ {
			if i != 5 {
				want[i] = []int32{0}
			}
		}
		want[3] = []int32{0, 1}
		started := time.Now()
		testutil.CheckFor(t, 60*time.Second, 50*time.Millisecond, func() error {
			mu.Lock()
			defer mu.Unlock()
			if len(got[3]) < 2 || len(got) < len(want) {
				return fmt.Errorf("deliveries so far %v", got)
			}
			return nil
		})
		t.Logf("every selected message and the retried one delivered %v after Start", time.Since(started).Round(time.Millisecond))
		if err := pc.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		for i, w := range want {
			if !slices.Equal(got[i], w) {
				t.Errorf("message %d: deliveries with reconsume times %v, want %v", i, got[i], w)
			}
		}
		for i := range got {
			if _, ok := want[i]; !ok {
				t.Errorf("message %d, excluded by the selector, was delivered", i)
			}
		}
		mu.Unlock()

		testJavaBrokerRequestReply(t, ctx, cl, c, p)
	})
}

func testJavaBrokerRequestReply(t *testing.T, ctx context.Context, cl *client.Client, c *javapeer.Cluster, p *client.Producer) {
	topic := uniqueName(t, "req")
	createJavaTopic(t, cl, c, topic, 1)
	replier := newJavaProducer(t, cl, uniqueName(t, "rp"))
	h := client.ConcurrentHandler(func(ctx context.Context, msgs []*client.ConsumedMessage) error {
		for _, m := range msgs {
			r, err := client.NewReplyMessage(&m.MessageExt, append([]byte("re:"), m.Body...))
			if err != nil {
				return err
			}
			if _, err := replier.Send(ctx, r); err != nil {
				return err
			}
		}
		return nil
	})
	pc, err := client.NewPushConsumer(cl, uniqueName(t, "rg"), h, client.WithConsumeFrom(client.ConsumeFromFirst))
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	if err := pc.Subscribe(topic, client.ByTag("*")); err != nil {
		t.Fatal(err)
	}
	if err := pc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		reply, err := p.Request(rctx, &client.Message{Topic: topic, Body: fmt.Appendf(nil, "q%d", i)})
		cancel()
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if string(reply.Body) != fmt.Sprintf("re:q%d", i) || reply.Topic != client.ReplyTopic(c.ClusterName) {
			t.Errorf("request %d: reply %q on %s", i, reply.Body, reply.Topic)
		}
		if v, _ := reply.Property(protocol.PropMsgType); v != "reply" {
			t.Errorf("request %d: reply MSG_TYPE %q", i, v)
		}
	}
	if err := pc.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}
