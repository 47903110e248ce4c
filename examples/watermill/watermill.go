// Package watermill is an example: one piece of event-driven logic written
// for watermill (github.com/ThreeDotsLabs/watermill) — a HandlerFunc behind
// Recoverer, Retry and CorrelationID middleware — run twice over runnel's
// embedded RocketMQ broker: once by a watermill Router whose Pub/Sub is
// runnel's RocketMQ transport (transport/watermill), and once, unchanged, as
// a checkpointed runnel pipeline (source/wmsource → pipeline/wmhandler →
// sink/wmsink). The example test runs both and compares their output.
package watermill

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	wm "github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/runnel-dev/runnel/embedded"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/pipeline/wmhandler"
	"github.com/runnel-dev/runnel/sink/wmsink"
	"github.com/runnel-dev/runnel/source/wmsource"
	"github.com/runnel-dev/runnel/transport/client"
	rwm "github.com/runnel-dev/runnel/transport/watermill"
)

// Broker is an in-process name server and broker on loopback (package
// embedded).
type Broker struct {
	NameServer string
	cl         *embedded.Cluster
}

// StartBroker starts an embedded name server and broker storing under dir.
func StartBroker(ctx context.Context, dir string) (*Broker, error) {
	cl, err := embedded.Start(ctx, embedded.WithDataDir(dir))
	if err != nil {
		return nil, err
	}
	return &Broker{NameServer: cl.NameServer(), cl: cl}, nil
}

// Close stops the broker and the name server.
func (b *Broker) Close(ctx context.Context) error { return b.cl.Shutdown(ctx) }

// NewPublisher returns a RocketMQ watermill Publisher on the broker.
func (b *Broker) NewPublisher() (*rwm.Publisher, error) {
	return rwm.NewPublisher(rwm.PublisherConfig{NameServers: []string{b.NameServer}, ClientOptions: b.cl.ClientOptions()}, wm.NopLogger{})
}

// NewSubscriber returns a RocketMQ watermill Subscriber in consumer group
// group.
func (b *Broker) NewSubscriber(group string) (*rwm.Subscriber, error) {
	return rwm.NewSubscriber(rwm.SubscriberConfig{NameServers: []string{b.NameServer}, ClientOptions: b.cl.ClientOptions(),
		ConsumerGroup: group, TopicQueueNums: 2,
		GroupOptions: []client.GroupOption{client.WithRebalanceInterval(time.Second)}}, wm.NopLogger{})
}

// Enrich is the business logic, a plain watermill handler: it turns an
// "order:<item>:<qty>" message into a "shipment" message, failing the first
// attempt of every order (a flaky dependency, absorbed by Retry) and
// panicking on malformed orders (Recoverer turns the panic into an error).
func Enrich(attempts func(uuid string) int) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		parts := strings.Split(string(msg.Payload), ":")
		if len(parts) != 3 {
			panic("malformed order " + strconv.Quote(string(msg.Payload)))
		}
		if attempts(msg.UUID) == 1 {
			return nil, errors.New("inventory service unavailable")
		}
		out := message.NewMessage(msg.UUID+"-shipment", fmt.Appendf(nil, "ship %s x%s", parts[1], parts[2]))
		return []*message.Message{out}, nil
	}
}

// Chain is the middleware both runs use, in Router order.
func Chain(h message.HandlerFunc) message.HandlerFunc {
	retry := middleware.Retry{MaxRetries: 2, InitialInterval: time.Millisecond}
	return wmhandler.Wrap(h, middleware.CorrelationID, retry.Middleware, middleware.Recoverer)
}

// RunRouter runs h under a watermill Router from topic in to topic out until
// ctx ends; the Router closes sub and pub when it stops. A message whose handler fails after retries is nacked by the
// Router (and redelivered), as watermill does.
func RunRouter(ctx context.Context, sub message.Subscriber, pub message.Publisher, in, out string, h message.HandlerFunc) error {
	r, err := message.NewRouter(message.RouterConfig{}, wm.NopLogger{})
	if err != nil {
		return err
	}
	r.AddHandler("enrich", in, sub, out, pub, h)
	return r.Run(ctx)
}

// NewJob builds the same logic as a runnel job: messages of topic in,
// handled by h, published to topic out; records h fails on (after the
// chain's retries) are skipped and counted, where the Router would redeliver
// them.
func NewJob(sub message.Subscriber, pub message.Publisher, in, out string, h message.HandlerFunc, opts ...pipeline.JobOption) *pipeline.Job {
	job := pipeline.New("enrich", opts...)
	orders := pipeline.FromSource(job, "orders", wmsource.New(sub, in))
	shipments := wmhandler.Handle(orders, "enrich", h, pipeline.OnError(pipeline.Skip()))
	pipeline.To(shipments, "shipments", wmsink.New(pub, out))
	return job
}
