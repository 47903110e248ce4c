package client

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// TestRequestReply runs request-reply through runnel's broker: a push
// consumer answers each request with NewReplyMessage; Request returns the
// reply pushed by the broker (PUSH_REPLY_MESSAGE_TO_CLIENT) with the
// request's correlation id, RequestAsync likewise; the replies are stored
// in the cluster's reply topic; a request nobody answers times out.
func TestRequestReply(t *testing.T) {
	gcl := startGroupCluster(t, 1)
	c := gcl.client(t)
	gcl.createTopic(t, c, "RQ", 2)
	replier := gcl.client(t)
	rp, err := NewProducer(replier, "reply-pg")
	if err != nil {
		t.Fatal(err)
	}
	defer rp.Close()
	var mu sync.Mutex
	requests := map[string]*protocol.MessageExt{} // by correlation id
	pc := newPushConsumer(t, replier, "GQ", ConcurrentHandler(func(ctx context.Context, msgs []*ConsumedMessage) error {
		for _, m := range msgs {
			id, _ := m.Property(protocol.PropCorrelationID)
			mc := m.Clone()
			mu.Lock()
			requests[id] = &mc
			mu.Unlock()
			reply, err := NewReplyMessage(&m.MessageExt, append([]byte("reply:"), m.Body...))
			if err != nil {
				return err
			}
			if _, err := rp.Send(ctx, reply); err != nil {
				return err
			}
		}
		return nil
	}), WithConsumeFrom(ConsumeFromFirst))
	startPush(t, pc, "RQ", ByTag("*"))

	p, err := NewProducer(c, "req-pg")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		reply, err := p.Request(ctx, &Message{Topic: "RQ", Body: []byte("q" + strconv.Itoa(i))})
		cancel()
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		id, _ := reply.Property(protocol.PropCorrelationID)
		mu.Lock()
		req := requests[id]
		mu.Unlock()
		if req == nil {
			t.Fatalf("reply %d carries correlation id %q of no request", i, id)
		}
		to, _ := req.Property(protocol.PropReplyToClient)
		ttl, _ := req.Property(protocol.PropTTL)
		if to != c.ClientID() || ttl == "" {
			t.Errorf("request %d: REPLY_TO_CLIENT %q TTL %q, want %q and a TTL", i, to, ttl, c.ClientID())
		}
		if string(reply.Body) != "reply:q"+strconv.Itoa(i) || reply.Topic != ReplyTopic("DefaultCluster") {
			t.Errorf("reply %d: body %q topic %q", i, reply.Body, reply.Topic)
		}
		if mt, _ := reply.Property(protocol.PropMsgType); mt != "reply" {
			t.Errorf("reply %d: MSG_TYPE %q", i, mt)
		}
		if at, _ := reply.Property(protocol.PropArriveTime); at == "" {
			t.Errorf("reply %d has no ARRIVE_TIME", i)
		}
	}

	done := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p.RequestAsync(ctx, &Message{Topic: "RQ", Body: []byte("async")}, func(m *protocol.MessageExt, err error) {
		if err == nil && string(m.Body) != "reply:async" {
			err = fmt.Errorf("async reply %q", m.Body)
		}
		done <- err
	})
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	stored, err := pullTopic(ctx, c, ReplyTopic("DefaultCluster"))
	if err != nil {
		t.Fatal(err)
	}
	if len(stored) != 4 {
		t.Errorf("the reply topic holds %d replies, want 4", len(stored))
	}

	// Nobody answers on another topic.
	gcl.createTopic(t, c, "RQ2", 1)
	tctx, tcancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer tcancel()
	start := time.Now()
	if _, err := p.Request(tctx, &Message{Topic: "RQ2", Body: []byte("?")}); !errors.Is(err, ErrRequestTimeout) {
		t.Errorf("unanswered request: %v, want ErrRequestTimeout", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("unanswered request returned after %v", d)
	}
}

func TestNewReplyMessage(t *testing.T) {
	if _, err := NewReplyMessage(&protocol.MessageExt{}, nil); !errors.Is(err, ErrInvalidMessage) {
		t.Errorf("reply to a request without CLUSTER: %v", err)
	}
	var props []byte
	for _, kv := range [][2]string{{protocol.PropCluster, "C1"}, {protocol.PropCorrelationID, "id"},
		{protocol.PropReplyToClient, "1.2.3.4@x"}, {protocol.PropTTL, "3000"}, {"other", "no"}} {
		props = protocol.AppendProperty(props, kv[0], kv[1])
	}
	m, err := NewReplyMessage(&protocol.MessageExt{Properties: string(props)}, []byte("b"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{protocol.PropMsgType: "reply", protocol.PropCorrelationID: "id",
		protocol.PropReplyToClient: "1.2.3.4@x", protocol.PropTTL: "3000"}
	if m.Topic != "C1_REPLY_TOPIC" || fmt.Sprint(m.Properties) != fmt.Sprint(want) {
		t.Errorf("reply %q %v", m.Topic, m.Properties)
	}
	if id := newCorrelationID(); len(id) != 36 || id[14] != '4' {
		t.Errorf("correlation id %q is not a UUID v4", id)
	}
}
