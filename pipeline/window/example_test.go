package window_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/pipeline/window"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
)

// Example counts clicks per user in 10-second tumbling windows of event
// time (the click's own time, WithTimestamps): a window fires when
// the watermark passes its end, and the end of the bounded input fires the
// windows still open. A click arriving after its window fired and expired
// would be late and go to the LateRecords side output (here printed).
func Example() {
	type click struct {
		User string
		At   int // seconds after 12:00:00
	}
	t0 := time.Date(2025, 5, 1, 12, 0, 0, 0, time.UTC)
	in := []click{{"ann", 1}, {"bob", 2}, {"ann", 4}, {"ann", 12}, {"bob", 15}, {"bob", 21}}

	job := pipeline.New("clicks")
	clicks := pipeline.FromSource(job, "clicks", source.NewSlice(in, 1)).
		WithTimestamps(func(c click) time.Time { return t0.Add(time.Duration(c.At) * time.Second) })
	late := pipeline.NewOutputTag[click]("late")
	counts := window.Apply(pipeline.KeyBy(clicks, func(c click) string { return c.User }), "clicks-per-user",
		window.Tumbling(10*time.Second), window.Count[click](), window.LateRecords(late))

	var mu sync.Mutex
	var lines []string
	print := func(s string) {
		mu.Lock()
		lines = append(lines, s)
		mu.Unlock()
	}
	pipeline.To(counts, "print", sink.NewFunc(func(_ context.Context, r window.Result[string, int64]) error {
		print(fmt.Sprintf("%s %s-%s %d", r.Key, r.Start.UTC().Format(time.TimeOnly), r.End.UTC().Format(time.TimeOnly), r.Value))
		return nil
	}, nil))
	pipeline.To(pipeline.SideOutput(counts, late), "print-late", sink.NewFunc(func(_ context.Context, c click) error {
		print(fmt.Sprintf("late: %s at 12:00:%02d", c.User, c.At))
		return nil
	}, nil))
	if err := job.Run(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	slices.Sort(lines) // keys fire in parallel subtasks
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// ann 12:00:00-12:00:10 2
	// ann 12:00:10-12:00:20 1
	// bob 12:00:00-12:00:10 1
	// bob 12:00:10-12:00:20 1
	// bob 12:00:20-12:00:30 1
}

// ExampleJoin joins two keyed streams per key and 1-minute window.
func ExampleJoin() {
	type reading struct {
		Sensor string
		At     time.Time
		V      float64
	}
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	ts := func(r reading) time.Time { return r.At }
	job := pipeline.New("temperature-humidity")
	temps := pipeline.FromSource(job, "temps", source.NewSlice([]reading{{"s1", at(5), 21.5}, {"s1", at(70), 22}, {"s2", at(10), 19}}, 1)).WithTimestamps(ts)
	hums := pipeline.FromSource(job, "hums", source.NewSlice([]reading{{"s1", at(30), 40}, {"s2", at(65), 55}}, 1)).WithTimestamps(ts)
	bySensor := func(r reading) string { return r.Sensor }
	c := pipeline.ConnectKeyed(pipeline.KeyBy(temps, bySensor), pipeline.KeyBy(hums, bySensor))
	res := window.Join(c, "join", window.Tumbling(time.Minute), func(t, h reading) (string, error) {
		return fmt.Sprintf("%.1f°C %.0f%%", t.V, h.V), nil
	})
	var mu sync.Mutex
	var got []string
	pipeline.To(res, "collect", sink.NewFunc(func(_ context.Context, r window.Result[string, string]) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, fmt.Sprintf("%s %s-%s %s", r.Key, r.Start.Format("15:04"), r.End.Format("15:04"), r.Value))
		return nil
	}, nil))
	if err := job.Run(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	slices.Sort(got)
	for _, s := range got {
		fmt.Println(s)
	}
	// Output:
	// s1 12:00-12:01 21.5°C 40%
}
