package watermill_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
)

// The universal Pub/Sub suite of watermill against the embedded broker.
//
// TestPubSub runs it on topics of 4 queues: consumer groups and persistence
// hold, order does not (GuaranteedOrder false). TestPubSubOrdered runs it on
// single-queue topics, where the Subscriber delivers a topic's messages in
// publish order (GuaranteedOrder true, which adds TestPublishSubscribeInOrder
// and TestNoAck). TestPubSubReconnect is the suite's TestReconnect (see
// there) against a `runnel broker` child process restarted twice.
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

// TestPubSubReconnect is watermill's TestReconnect written without its
// data race (watermill 1.5.1 appends to the published list on one
// goroutine and reads it on the test goroutine without synchronisation,
// which -race reports): a `runnel broker` child process is stopped and
// started again after a third and after half of the messages were
// published, while three publishers publish with retries and one
// Subscriber reads. Every published message must arrive (redeliveries
// allowed: delivery is at least once), none that was not published.
func TestPubSubReconnect(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and restarts a runnel broker process")
	}
	cb := startChildBroker(t)
	pc := pubSubConfig{queues: 4}
	pub, sub := newPublisher(t, cb.nsAddr, pc), newSubscriber(t, cb.nsAddr, pc)
	n := 300
	if os.Getenv("RUNNEL_WATERMILL_FULL") != "" {
		n = 10000 // watermill's own count
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	topic := "reconnect_" + string(tests.NewTestID())
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()

	var (
		mu        sync.Mutex
		published = map[string]bool{}
		restarts  int
		pubErr    error
	)
	next := make(chan int)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // hands out messages and restarts the broker on the way
		defer wg.Done()
		defer close(next)
		for i := range n {
			if i == n/3 || i == n/2 {
				if err := errors.Join(cb.stop(), cb.start()); err != nil {
					mu.Lock()
					pubErr = fmt.Errorf("restart broker: %w", err)
					mu.Unlock()
					return
				}
				mu.Lock()
				restarts++
				mu.Unlock()
			}
			select {
			case next <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				msg := message.NewMessage(watermill.NewUUID(), []byte("x"))
				for {
					err := pub.Publish(topic, msg)
					if err == nil {
						break
					}
					if ctx.Err() != nil {
						mu.Lock()
						pubErr = fmt.Errorf("publish %s: %w", msg.UUID, err)
						mu.Unlock()
						return
					}
					time.Sleep(100 * time.Millisecond) // the broker is restarting
				}
				mu.Lock()
				published[msg.UUID] = true
				mu.Unlock()
			}
		}()
	}

	received := map[string]int{}
	done := func() bool {
		mu.Lock()
		defer mu.Unlock()
		if len(published) < n {
			return false
		}
		for id := range published {
			if received[id] == 0 {
				return false
			}
		}
		return true
	}
	// The last message can arrive before its publisher has marked it
	// published: done is checked again every 100 ms, not only on arrivals.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for !done() {
		select {
		case m, ok := <-msgs:
			if !ok {
				t.Fatal("subscription closed")
			}
			received[m.UUID]++
			m.Ack()
		case <-tick.C:
		case <-ctx.Done():
			mu.Lock()
			t.Fatalf("after %v: %d of %d published (%v), %d distinct received", time.Since(start), len(published), n, pubErr, len(received))
			mu.Unlock()
		}
	}
	cancel()
	wg.Wait()
	if pubErr != nil && !errors.Is(pubErr, context.Canceled) {
		t.Fatal(pubErr)
	}
	dups := 0
	for id, c := range received {
		if !published[id] {
			t.Errorf("received %s, which was never published", id)
		}
		dups += c - 1
	}
	if restarts != 2 {
		t.Errorf("broker restarted %d times, want 2", restarts)
	}
	t.Logf("%d messages through 2 broker restarts in %v, %d redelivered", n, time.Since(start), dups)
}
