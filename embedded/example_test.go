package embedded_test

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/runnel-dev/runnel/embedded"
	"github.com/runnel-dev/runnel/pipeline"
	mqsink "github.com/runnel-dev/runnel/sink/rocketmq"
	srcmq "github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/transport/client"
)

// buildShout is the job under test: the words of topic "words" upper-cased
// into topic "shouts" (sent through p). A user's job is built the same way,
// by a function that both main and the tests call.
func buildShout(job *pipeline.Job, c *client.Client, p *client.Producer) error {
	src, err := srcmq.New(c, "words", srcmq.WithStop(srcmq.StopAtLatest())) // bounded: the test ends
	if err != nil {
		return err
	}
	out, err := mqsink.New(p, func(w string) (*client.Message, error) {
		return &client.Message{Topic: "shouts", Body: []byte(w)}, nil
	})
	if err != nil {
		return err
	}
	words := pipeline.FromSourceDecoded(job, "words", src, func(m srcmq.Message) (string, error) { return string(m.Body), nil })
	shouts := pipeline.Map(words, "shout", func(_ context.Context, w string) (string, error) { return strings.ToUpper(w), nil })
	pipeline.To(shouts, "out", out)
	return nil
}

// Example tests a job end to end against an embedded cluster: the input
// produced to a topic, the job run over it, its output topic read back. In
// a Go test, embedded.Run(t, …) replaces Start and the deferred Close.
func Example() {
	ctx := context.Background()
	cl, err := embedded.Start(ctx, embedded.WithTopic("words", 2), embedded.WithTopic("shouts", 1))
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
	for _, w := range strings.Fields("to be or not to be") {
		if _, err := p.Send(ctx, &client.Message{Topic: "words", Body: []byte(w)}); err != nil {
			fmt.Println(err)
			return
		}
	}

	job := pipeline.New("shout")
	if err := buildShout(job, cl.Client(), p); err != nil {
		fmt.Println(err)
		return
	}
	if err := job.Run(ctx); err != nil {
		fmt.Println(err)
		return
	}

	msgs, err := cl.Messages(ctx, "shouts")
	if err != nil {
		fmt.Println(err)
		return
	}
	var got []string
	for _, m := range msgs {
		got = append(got, string(m.Body))
	}
	slices.Sort(got) // the input's two queues are read in parallel
	fmt.Println(got)
	// Output: [BE BE NOT OR TO TO]
}
