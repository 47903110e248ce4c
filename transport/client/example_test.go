package client_test

import (
	"context"
	"fmt"

	"github.com/runnel-dev/runnel/embedded"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// Example connects to a cluster through its name servers, sends a message
// with a key and a tag, and pulls it back from its queue by offset, as a
// RocketMQ pull consumer does.
func Example() {
	ctx := context.Background()
	cl, err := embedded.Start(ctx, embedded.WithTopic("orders", 1)) // or a real cluster's name servers
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cl.Close()

	c, err := client.New(client.WithNameServers(cl.NameServer()))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	p, err := client.NewProducer(c, "order-service")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close()
	res, err := p.Send(ctx, &client.Message{Topic: "orders", Tags: "created", Keys: []string{"o-1"}, Body: []byte(`{"id":"o-1"}`)})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(res.Status, "at offset", res.QueueOffset)

	pr, err := c.Pull(ctx, client.PullRequest{Queue: res.Queue, Offset: 0, Group: "order-reader", MaxMsgs: 16})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, m := range pr.Messages {
		fmt.Println(m.Tags(), m.Keys(), string(m.Body))
	}
	fmt.Println("next offset", pr.NextBeginOffset)
	// Output:
	// SEND_OK at offset 0
	// created o-1 {"id":"o-1"}
	// next offset 1
}

// ExampleClient_MaxOffset shows the offsets of a queue: the broker's end
// of a queue is the offset the next message gets.
func ExampleClient_MaxOffset() {
	ctx := context.Background()
	cl, err := embedded.Start(ctx, embedded.WithTopic("events", 2))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cl.Close()
	q := protocol.MessageQueue{Topic: "events", BrokerName: cl.Brokers()[0].Name(), QueueID: 1}
	end, err := cl.Client().MaxOffset(ctx, q)
	fmt.Println(q.QueueID, end, err)
	// Output: 1 0 <nil>
}
