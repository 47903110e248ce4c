package watermill_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	ex "github.com/runnel-dev/runnel/examples/watermill"
	"github.com/runnel-dev/runnel/pipeline"
)

// counter counts handler calls per message UUID (one per Router or job).
type counter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counter) add(uuid string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[uuid]++
	return c.n[uuid]
}

// collect reads n messages of topic (group group) and renders them sorted.
func collect(ctx context.Context, b *ex.Broker, group, topic string, n int) ([]string, error) {
	sub, err := b.NewSubscriber(group)
	if err != nil {
		return nil, err
	}
	defer sub.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	var got []string
	for len(got) < n {
		select {
		case m := <-ch:
			got = append(got, fmt.Sprintf("%s %q correlation=%s", m.UUID, m.Payload, middleware.MessageCorrelationID(m)))
			m.Ack()
		case <-ctx.Done():
			return got, ctx.Err()
		}
	}
	sort.Strings(got)
	return got, nil
}

func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir, err := os.MkdirTemp("", "runnel-watermill-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	b, err := ex.StartBroker(ctx, dir)
	if err != nil {
		panic(err)
	}
	defer b.Close(context.Background())
	pub, err := b.NewPublisher()
	if err != nil {
		panic(err)
	}
	defer pub.Close()

	// Create the topics before anything is published to or subscribed on
	// them. Otherwise a Subscribe that finds no topic creates it with its
	// own queue count (UPDATE_AND_CREATE_TOPIC) while the Router's first send
	// may create it too, with the producer's default count, an instant
	// earlier: a message the send put on a queue beyond the Subscribe's count
	// could then not be read.
	topics, err := b.NewSubscriber("example-setup")
	if err != nil {
		panic(err)
	}
	for _, t := range []string{"orders", "shipments-router", "shipments-runnel"} {
		if err := topics.SubscribeInitialize(t); err != nil {
			panic(err)
		}
	}
	if err := topics.Close(); err != nil {
		panic(err)
	}

	orders := []string{"order:apple:3", "order:pear:1", "broken", "order:fig:12"}
	for i, o := range orders {
		m := message.NewMessage(fmt.Sprintf("o%d", i), []byte(o))
		middleware.SetCorrelationID(fmt.Sprintf("req-%d", i), m)
		if err := pub.Publish("orders", m); err != nil {
			panic(err)
		}
	}

	// 1. A watermill Router over RocketMQ.
	routerSub, err := b.NewSubscriber("router-enrich")
	if err != nil {
		panic(err)
	}
	defer routerSub.Close()
	routerPub, err := b.NewPublisher() // the Router closes its handlers' Publishers and Subscribers
	if err != nil {
		panic(err)
	}
	routerCalls := &counter{n: map[string]int{}}
	rctx, stopRouter := context.WithCancel(ctx)
	routerDone := make(chan error, 1)
	go func() {
		routerDone <- ex.RunRouter(rctx, routerSub, routerPub, "orders", "shipments-router", ex.Chain(ex.Enrich(routerCalls.add)))
	}()
	fromRouter, err := collect(ctx, b, "read-router", "shipments-router", 3)
	stopRouter()
	if rerr := <-routerDone; rerr != nil || err != nil {
		panic(fmt.Sprint(rerr, err))
	}

	// 2. The same handler and middleware as a checkpointed runnel job.
	jobSub, err := b.NewSubscriber("runnel-enrich")
	if err != nil {
		panic(err)
	}
	defer jobSub.Close()
	jobCalls := &counter{n: map[string]int{}}
	job := ex.NewJob(jobSub, pub, "orders", "shipments-runnel", ex.Chain(ex.Enrich(jobCalls.add)),
		pipeline.CheckpointDir(dir+"/job"), pipeline.CheckpointInterval(20*time.Millisecond))
	jctx, stopJob := context.WithCancel(ctx)
	jobDone := make(chan error, 1)
	go func() { jobDone <- job.Run(jctx) }()
	fromJob, err := collect(ctx, b, "read-runnel", "shipments-runnel", 3)
	stopJob()
	if jerr := <-jobDone; jerr != nil || err != nil {
		panic(fmt.Sprint(jerr, err))
	}

	fmt.Println("router:")
	for _, s := range fromRouter {
		fmt.Println(" ", s)
	}
	fmt.Println("runnel:")
	for _, s := range fromJob {
		fmt.Println(" ", s)
	}
	// Output:
	// router:
	//   o0-shipment "ship apple x3" correlation=req-0
	//   o1-shipment "ship pear x1" correlation=req-1
	//   o3-shipment "ship fig x12" correlation=req-3
	// runnel:
	//   o0-shipment "ship apple x3" correlation=req-0
	//   o1-shipment "ship pear x1" correlation=req-1
	//   o3-shipment "ship fig x12" correlation=req-3
}
