//go:build stress

package watermill_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
)

// TestPubSubStressTest runs watermill's stress variant (the suite
// STRESS_TEST_COUNT times in parallel, default 10) on 4-queue topics:
//
//	go test -tags stress -run TestPubSubStressTest ./transport/watermill/
func TestPubSubStressTest(t *testing.T) {
	e := newEnv(t)
	pc := pubSubConfig{queues: 4}
	tests.TestPubSubStressTest(t, suiteFeatures(false),
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
