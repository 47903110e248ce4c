// Package wordcount is the word-count job of runnel's examples and demo:
// lines read from a RocketMQ topic, split into words, counted per word in
// keyed state, and the final counts emitted when the (bounded) input ends.
// It also makes and produces sample text, so that the example and `runnel
// demo wordcount` (which run it on package embedded's in-process cluster)
// need nothing but Go.
package wordcount

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
	"unicode"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/state"
	"github.com/runnel-dev/runnel/transport/client"
)

// WordCount is one word's count.
type WordCount struct {
	Word  string
	Count int64
}

// String renders c as "word<TAB>count".
func (c WordCount) String() string { return fmt.Sprintf("%s\t%d", c.Word, c.Count) }

// Words splits a line into lower-case words (runs of letters and digits).
func Words(line string) []string {
	return strings.FieldsFunc(strings.ToLower(line), func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) })
}

// endOfInput is the event-time timer that fires when the bounded input
// ends: later than any record's event time, yet within UnixNano's range (the
// runtime keeps timestamps as int64 nanoseconds).
var endOfInput = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)

// Build adds the word-count graph to job: src (lines) → "split" → KeyBy
// word → "count" (a Value[int64] per word) → out, which receives each word's
// final count once the input has ended (a bounded source). The UIDs
// ("lines", "split", "count", "out") are stable across versions.
func Build(job *pipeline.Job, src *rocketmq.Source, out sink.Sink[WordCount]) {
	lines := pipeline.FromSource(job, "lines", src)
	words := pipeline.FlatMap(lines, "split", func(_ context.Context, m rocketmq.Message, c *pipeline.Collector[string]) error {
		for _, w := range Words(string(m.Body)) {
			c.Emit(w)
		}
		return nil
	})
	counts := pipeline.Process(pipeline.KeyBy(words, func(w string) string { return w }), "count",
		func() pipeline.KeyedProcessFunc[string, string, WordCount] { return &counter{} })
	pipeline.To(counts, "out", out)
}

// counter counts a word's records in keyed state and emits the count when
// the input ends.
type counter struct{ n *state.Value[int64] }

func (c *counter) Open(ctx *pipeline.OpenContext) (err error) {
	c.n, err = state.NewValue(ctx.Backend(), "n", state.Int64Codec())
	return err
}

func (c *counter) ProcessElement(ctx *pipeline.KeyedContext[string, WordCount], _ string) error {
	n, _, err := c.n.Get()
	if err != nil {
		return err
	}
	if n == 0 {
		if err := ctx.RegisterEventTimer(endOfInput); err != nil {
			return err
		}
	}
	return c.n.Set(n + 1)
}

func (c *counter) OnTimer(ctx *pipeline.KeyedContext[string, WordCount], _ pipeline.Timer) error {
	n, _, err := c.n.Get()
	if err != nil {
		return err
	}
	return ctx.Emit(WordCount{Word: ctx.Key(), Count: n})
}

// vocabulary of the sample text; earlier words are more frequent.
var vocabulary = strings.Fields(`the stream flows and a river of records runs through every queue while
	state keeps counts per key so checkpoints make each crash harmless when barriers align offsets
	with pebble batches broker name server pull push long polling exactly once window timer watermark
	event time source sink operator job task split key group shuffle backpressure savepoint restore`)

// SampleLines returns n deterministic lines of sample text (seeded by seed),
// 3 to 12 words each, with a skewed word distribution.
func SampleLines(n int, seed uint64) []string {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	lines := make([]string, n)
	var b strings.Builder
	for i := range lines {
		b.Reset()
		for w := range 3 + rng.IntN(10) {
			if w > 0 {
				b.WriteByte(' ')
			}
			// Skew: min of two uniform draws favours small indexes.
			b.WriteString(vocabulary[min(rng.IntN(len(vocabulary)), rng.IntN(len(vocabulary)))])
		}
		lines[i] = b.String()
	}
	return lines
}

// Count returns the word counts of lines (the expected result of the job).
func Count(lines []string) map[string]int64 {
	m := make(map[string]int64)
	for _, l := range lines {
		for _, w := range Words(l) {
			m[w]++
		}
	}
	return m
}

// Produce sends lines to topic through p (c is p's client), spread over its writable queues in order
// (line i to queue i mod the number of queues), in batches of 128; progress
// (when not nil) is called with the number of lines sent so far after each
// batch.
func Produce(ctx context.Context, c *client.Client, p *client.Producer, topic string, lines []string, progress func(int)) error {
	r, err := c.Route(ctx, topic)
	if err != nil {
		return fmt.Errorf("wordcount: produce: %w", err)
	}
	qs := r.PublishQueues()
	if len(qs) == 0 {
		return fmt.Errorf("wordcount: produce: topic %s has no writable queue", topic)
	}
	const batch = 128
	sent := 0
	msgs := make([]*client.Message, 0, batch)
	for start := 0; start < len(lines); start += batch * len(qs) {
		for qi := range qs {
			q := qs[qi]
			msgs = msgs[:0]
			for i := start + qi; i < min(start+batch*len(qs), len(lines)); i += len(qs) {
				msgs = append(msgs, &client.Message{Topic: topic, Body: []byte(lines[i]), Queue: &q})
			}
			if len(msgs) == 0 {
				continue
			}
			if _, err := p.Send(ctx, msgs...); err != nil {
				return fmt.Errorf("wordcount: produce: %w", err)
			}
			sent += len(msgs)
			if progress != nil {
				progress(sent)
			}
		}
	}
	return nil
}
