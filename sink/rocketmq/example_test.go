package rocketmq_test

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/runnel-dev/runnel/embedded"
	"github.com/runnel-dev/runnel/pipeline"
	mqsink "github.com/runnel-dev/runnel/sink/rocketmq"
	srcmq "github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/state"
	"github.com/runnel-dev/runnel/transport/client"
)

// ExampleNewExactlyOnce writes a job's records to a topic exactly once:
// each checkpoint's records are half messages (transactional messages)
// that the sink commits once the checkpoint that lists them is durable, so
// a crash at any instant neither loses nor repeats output. The producer
// group is derived from the job's name and the sink's UID.
func ExampleNewExactlyOnce() {
	ctx := context.Background()
	cl, err := embedded.Start(ctx, embedded.WithTopic("words", 1), embedded.WithTopic("shouts", 1))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cl.Close()
	p, err := client.NewProducer(cl.Client(), "example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close()
	for _, w := range []string{"hello", "world"} {
		if _, err := p.Send(ctx, &client.Message{Topic: "words", Body: []byte(w)}); err != nil {
			fmt.Println(err)
			return
		}
	}

	src, err := srcmq.New(cl.Client(), "words", srcmq.WithStop(srcmq.StopAtLatest()))
	if err != nil {
		fmt.Println(err)
		return
	}
	out, err := mqsink.NewExactlyOnce(cl.Client(), func(s string) (*client.Message, error) {
		return &client.Message{Topic: "shouts", Body: []byte(s), ShardingKey: s}, nil
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	job := pipeline.New("shouter", pipeline.CheckpointDir(cl.DataDir()+"/shouter"))
	words := pipeline.FromBytes(job, "words", src.Bytes(), state.StringCodec())
	upper := pipeline.Map(words, "upper", func(_ context.Context, s string) (string, error) { return strings.ToUpper(s), nil })
	pipeline.To(upper, "shouts", out)
	if err := job.Run(ctx); err != nil {
		fmt.Println(err)
		return
	}

	// What a consumer of the output topic reads: committed messages only.
	q := client.PullRequest{Group: "reader", MaxMsgs: 32}
	q.Queue.Topic, q.Queue.BrokerName = "shouts", cl.Brokers()[0].Name()
	res, err := cl.Client().Pull(ctx, q)
	if err != nil {
		fmt.Println(err)
		return
	}
	var got []string
	for _, m := range res.Messages {
		got = append(got, string(m.Body))
	}
	slices.Sort(got)
	fmt.Println(got)
	// Output: [HELLO WORLD]
}
