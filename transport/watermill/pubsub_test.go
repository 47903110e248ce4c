package watermill_test

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
)

// The universal Pub/Sub suite of watermill against the embedded broker.
//
// TestPubSub runs it on topics of 4 queues: consumer groups and persistence
// hold, order does not (GuaranteedOrder false). TestPubSubOrdered runs it on
// single-queue topics, where the Subscriber delivers a topic's messages in
// publish order (GuaranteedOrder true, which adds TestPublishSubscribeInOrder
// and TestNoAck). TestPubSubReconnect runs the suite's TestReconnect against a
// `runnel broker` child process restarted twice in the middle.
//
// Without RUNNEL_WATERMILL_FULL=1 the suites run with ForceShort (watermill's
// smaller message counts) so that `make test` stays within its budget; with
// it they run at watermill's full size (see the README of the repository).

func suiteFeatures(ordered bool) tests.Features {
	return tests.Features{
		ConsumerGroups:      true,
		ExactlyOnceDelivery: false,
		GuaranteedOrder:     ordered,
		Persistent:          true,
		// A new Subscriber of an existing group continues from the group's
		// committed offsets; it does not re-read consumed messages.
		NewSubscriberReceivesOldMessages: false,
		ForceShort:                       os.Getenv("RUNNEL_WATERMILL_FULL") == "",
	}
}

func runSuite(t *testing.T, queues int, ordered bool) {
	e := newEnv(t)
	pc := pubSubConfig{queues: queues}
	tests.TestPubSub(t, suiteFeatures(ordered),
		func(t *testing.T) (message.Publisher, message.Subscriber) {
			return newPublisher(t, e.nsAddr, pc), newSubscriber(t, e.nsAddr, pc)
		},
		func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
			gpc := pc
			gpc.group = group
			return newPublisher(t, e.nsAddr, gpc), newSubscriber(t, e.nsAddr, gpc)
		},
	)
}

func TestPubSub(t *testing.T) {
	runSuite(t, 4, false)
}

func TestPubSubOrdered(t *testing.T) {
	runSuite(t, 1, true)
}

func TestPubSubReconnect(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and restarts a runnel broker process")
	}
	cb := startChildBroker(t)
	features := suiteFeatures(false)
	features.RestartServiceCommand = cb.restartCommand()
	pc := pubSubConfig{queues: 4}
	start := time.Now()
	tests.TestReconnect(t, tests.TestContext{TestID: tests.NewTestID(), Features: features},
		func(t *testing.T) (message.Publisher, message.Subscriber) {
			return newPublisher(t, cb.nsAddr, pc), lagSubscriber{newSubscriber(t, cb.nsAddr, pc)}
		})
	t.Logf("reconnect test took %v", time.Since(start))
}

// lagSubscriber hands on each message at least reconnectLag after it
// arrived. watermill's TestReconnect records a published message on a
// collector goroutine after Publish returns and compares that record as soon
// as the last message was received, so a Pub/Sub that delivers within
// microseconds of the publish (the embedded broker on loopback) can beat the
// collector and fail with a published message reported as "extra". The lag
// closes that race in the suite; it hides no loss or duplicate.
type lagSubscriber struct{ message.Subscriber }

const reconnectLag = 2 * time.Millisecond

func (l lagSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := l.Subscriber.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	go func() {
		var wg sync.WaitGroup
		defer func() { wg.Wait(); close(out) }()
		for msg := range in {
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(reconnectLag) // see lagSubscriber
				select {
				case out <- msg:
				case <-msg.Context().Done(): // the subscription ended
				}
			}()
		}
	}()
	return out, nil
}
