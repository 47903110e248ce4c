package rocketmq_test

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/runnel-dev/runnel/embedded"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/state"
	"github.com/runnel-dev/runnel/transport/client"
)

// Example reads a topic's message bodies into a job: a split per queue,
// from the earliest message (the default start) to the queues' ends at
// the time they are opened (StopAtLatest makes the job bounded). The job
// keeps the offsets in its checkpoints; after each one the source reports
// them to the broker under the job's consumer group, for lag tools.
func Example() {
	ctx := context.Background()
	cl, err := embedded.Start(ctx, embedded.WithTopic("greetings", 2)) // runnel broker, in process
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
	for _, b := range []string{"hello", "hej", "hola"} {
		if _, err := p.Send(ctx, &client.Message{Topic: "greetings", Body: []byte(b)}); err != nil {
			fmt.Println(err)
			return
		}
	}

	src, err := rocketmq.New(cl.Client(), "greetings", rocketmq.WithStop(rocketmq.StopAtLatest()))
	if err != nil {
		fmt.Println(err)
		return
	}
	job := pipeline.New("greeter")
	var mu sync.Mutex
	var got []string
	pipeline.To(pipeline.FromBytes(job, "greetings", src.Bytes(), state.StringCodec()), "collect",
		sink.NewFunc(func(_ context.Context, s string) error {
			mu.Lock()
			got = append(got, s)
			mu.Unlock()
			return nil
		}, nil))
	if err := job.Run(ctx); err != nil {
		fmt.Println(err)
		return
	}
	slices.Sort(got) // two queues, read in parallel
	fmt.Println(got, "as group", src.Group())
	// Output: [hej hello hola] as group greeter
}

// ExampleOffset shows how a split's checkpointed offset reads (runnel
// checkpoint inspect and the status page show it so).
func ExampleOffset() {
	enc := rocketmq.Offset{Next: 405, End: -1}.AppendTo(nil)
	o, err := rocketmq.DecodeOffset(enc)
	fmt.Println(o, err)
	fmt.Println(rocketmq.Offset{Next: 405, End: 500})
	// Output:
	// next 405 <nil>
	// next 405 (stop at 500)
}
