package javatest

import (
	"net/netip"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"

	"github.com/runnel-dev/runnel/internal/javapeer"
	"github.com/runnel-dev/runnel/transport/client"
	rwm "github.com/runnel-dev/runnel/transport/watermill"
)

// TestJavaBrokerWatermill runs watermill's universal Pub/Sub suite (its
// short counts, as transport/watermill's own test does in `make test`)
// against Apache RocketMQ's broker: RocketMQ as a watermill Publisher and
// Subscriber (consumer groups, persistence, acks and nacks, closing
// mid-stream), on topics of 4 queues without order and of 1 queue in
// publish order. The Subscriber creates each topic on the Java cluster
// (SubscribeInitialize). TestReconnect, which restarts the broker, is not
// run here (the shared cluster stays up).
func TestJavaBrokerWatermill(t *testing.T) {
	for _, v := range brokerVersions {
		t.Run(v, func(t *testing.T) {
			_, jc := javaCluster(t, v)
			awaitRegistered(t, jc)
			for _, queues := range []int{4, 1} {
				t.Run(map[int]string{4: "queues=4", 1: "ordered"}[queues], func(t *testing.T) {
					runJavaWatermill(t, jc, queues)
				})
			}
		})
	}
}

func runJavaWatermill(t *testing.T, jc *javapeer.Cluster, queues int) {
	copts := []client.Option{client.WithClientIP(netip.MustParseAddr("127.0.0.1"))}
	pub := func(t *testing.T) message.Publisher {
		p, err := rwm.NewPublisher(rwm.PublisherConfig{NameServers: []string{jc.NameServer}, ClientOptions: copts,
			ProducerOptions: []client.ProducerOption{client.WithDefaultTopicQueueNums(queues)}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		return p
	}
	sub := func(t *testing.T, group string) message.Subscriber {
		s, err := rwm.NewSubscriber(rwm.SubscriberConfig{NameServers: []string{jc.NameServer}, ClientOptions: copts,
			ConsumerGroup: group, TopicQueueNums: queues, TopicCluster: jc.ClusterName,
			GroupOptions: []client.GroupOption{client.WithRebalanceInterval(2 * time.Second)}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	features := tests.Features{
		ConsumerGroups:                   true,
		ExactlyOnceDelivery:              false,
		GuaranteedOrder:                  queues == 1,
		Persistent:                       true,
		NewSubscriberReceivesOldMessages: false,
		ForceShort:                       true,
	}
	start := time.Now()
	tests.TestPubSub(t, features,
		func(t *testing.T) (message.Publisher, message.Subscriber) { return pub(t), sub(t, "") },
		func(t *testing.T, group string) (message.Publisher, message.Subscriber) { return pub(t), sub(t, group) },
	)
	t.Cleanup(func() { t.Logf("suite took %v", time.Since(start).Round(time.Millisecond)) })
}
