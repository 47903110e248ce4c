package pipeline_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
	"github.com/runnel-dev/runnel/state"
)

type customer struct {
	ID   string
	Name string
}

type purchase struct {
	Customer string
	Item     string
}

// enrich names purchases with their customer's name: a purchase that
// arrives before its customer waits in the key's state, so the result does
// not depend on how the two inputs interleave.
type enrich struct {
	name    *state.Value[string]
	waiting *state.List[string]
}

func (e *enrich) Open(ctx *pipeline.OpenContext) (err error) {
	if e.name, err = state.NewValue(ctx.Backend(), "name", state.StringCodec()); err != nil {
		return err
	}
	e.waiting, err = state.NewList(ctx.Backend(), "waiting", state.StringCodec())
	return err
}

func (e *enrich) ProcessElement1(ctx *pipeline.KeyedContext[string, string], c customer) error {
	if err := e.name.Set(c.Name); err != nil {
		return err
	}
	items, err := e.waiting.Get()
	if err != nil {
		return err
	}
	for _, it := range items {
		if err := ctx.Emit(c.Name + " bought " + it); err != nil {
			return err
		}
	}
	return e.waiting.Clear()
}

func (e *enrich) ProcessElement2(ctx *pipeline.KeyedContext[string, string], p purchase) error {
	n, ok, err := e.name.Get()
	if err != nil || !ok {
		if err == nil {
			err = e.waiting.Add(p.Item)
		}
		return err
	}
	return ctx.Emit(n + " bought " + p.Item)
}

func (e *enrich) OnTimer(*pipeline.KeyedContext[string, string], pipeline.Timer) error { return nil }

// ExampleKeyedCoProcess connects two streams keyed by customer: both
// inputs of the function share the key's state.
func ExampleKeyedCoProcess() {
	job := pipeline.New("enrich")
	customers := pipeline.FromSource(job, "customers", source.NewSlice([]customer{{"c1", "Ada"}, {"c2", "Grace"}}, 1))
	purchases := pipeline.FromSource(job, "purchases", source.NewSlice([]purchase{{"c1", "tea"}, {"c2", "books"}, {"c1", "cake"}}, 2))
	c := pipeline.ConnectKeyed(pipeline.KeyBy(customers, func(c customer) string { return c.ID }),
		pipeline.KeyBy(purchases, func(p purchase) string { return p.Customer }))
	out := pipeline.KeyedCoProcess(c, "enrich", func() pipeline.KeyedCoProcessFunc[string, customer, purchase, string] { return &enrich{} })

	var mu sync.Mutex
	var got []string
	pipeline.To(out, "collect", sink.NewFunc(func(_ context.Context, s string) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, s)
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
	// Ada bought cake
	// Ada bought tea
	// Grace bought books
}

type click struct {
	User string
	Page string
	At   time.Time
}

type shopOrder struct {
	User string
	Item string
	At   time.Time
}

// ExampleIntervalJoin joins each click with the orders of the same user in
// the 10 minutes after it.
func ExampleIntervalJoin() {
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	min := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	job := pipeline.New("click-to-order")
	clicks := pipeline.FromSource(job, "clicks", source.NewSlice([]click{
		{"ann", "shoes", min(0)}, {"bob", "hats", min(1)}, {"ann", "socks", min(30)},
	}, 1)).WithTimestamps(func(c click) time.Time { return c.At })
	orders := pipeline.FromSource(job, "orders", source.NewSlice([]shopOrder{
		{"ann", "shoes", min(4)}, {"bob", "hats", min(20)}, {"ann", "socks", min(33)},
	}, 1)).WithTimestamps(func(o shopOrder) time.Time { return o.At })
	c := pipeline.ConnectKeyed(pipeline.KeyBy(clicks, func(c click) string { return c.User }),
		pipeline.KeyBy(orders, func(o shopOrder) string { return o.User }))
	joined := pipeline.IntervalJoin(c, "click-order", 0, 10*time.Minute, func(_ context.Context, c click, o shopOrder) (string, error) {
		return fmt.Sprintf("%s clicked %s and ordered %s %v later", c.User, c.Page, o.Item, o.At.Sub(c.At)), nil
	})

	var mu sync.Mutex
	var got []string
	pipeline.To(joined, "collect", sink.NewFunc(func(_ context.Context, s string) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, s)
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
	// ann clicked shoes and ordered shoes 4m0s later
	// ann clicked socks and ordered socks 3m0s later
}
