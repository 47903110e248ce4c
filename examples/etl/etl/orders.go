package etl

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	mqsink "github.com/runnel-dev/runnel/sink/rocketmq"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// Sample is a generated input order.
type Sample struct {
	Body     []byte
	ID       string // "" for invalid samples without one
	Customer string
	Valid    bool
	Amount   float64
	Currency string
	// Seq is the order's index among its customer's valid orders (from 1).
	Seq int64
}

// currencies of the generated orders (XTS is well-formed but not in Rates).
var currencies = []string{"EUR", "USD", "GBP", "CHF", "JPY", "SEK", "XTS"}

// SampleOrders returns n deterministic orders of the given number of
// customers; about one in invalidEvery is invalid (0: none) in one of
// several ways (not JSON, missing id or customer, amount ≤ 0, bad currency,
// wrong type).
func SampleOrders(n, customers, invalidEvery int, seed uint64) []Sample {
	rng := rand.New(rand.NewPCG(seed, 0xe71))
	out := make([]Sample, n)
	seqs := make(map[string]int64, customers)
	base := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range out {
		cust := "c" + strconv.Itoa(rng.IntN(max(customers, 1)))
		s := Sample{ID: "o" + strconv.Itoa(i), Customer: cust, Amount: float64(1+rng.IntN(99_999)) / 100,
			Currency: currencies[rng.IntN(len(currencies))]}
		ts := base.Add(time.Duration(i) * time.Second).Format(time.RFC3339)
		order := func(id, cust, amount, cur string) []byte {
			return fmt.Appendf(nil, `{"id":%q,"customer":%q,"amount":%s,"currency":%q,"ts":%q}`, id, cust, amount, cur, ts)
		}
		amount := strconv.FormatFloat(s.Amount, 'f', -1, 64)
		if invalidEvery > 0 && rng.IntN(invalidEvery) == 0 {
			switch rng.IntN(6) {
			case 0:
				s.Body = []byte("not json " + s.ID)
			case 1:
				s.Body = order("", cust, amount, s.Currency)
			case 2:
				s.Body = order(s.ID, "", amount, s.Currency)
			case 3:
				s.Body = order(s.ID, cust, "-"+amount, s.Currency)
			case 4:
				s.Body = order(s.ID, cust, amount, strings.ToLower(s.Currency))
			default:
				s.Body = fmt.Appendf(nil, `{"id":%q,"customer":%q,"amount":"%s","currency":"EUR"}`, s.ID, cust, amount)
			}
			out[i] = s
			continue
		}
		s.Valid = true
		seqs[cust]++
		s.Seq = seqs[cust]
		s.Body = order(s.ID, cust, amount, s.Currency)
		out[i] = s
	}
	return out
}

// Produce sends the samples to topic in order, in batches per queue, each
// customer's orders to one queue (hash of the customer, as the job's
// output), calling progress (when not nil) with the count sent so far.
func Produce(ctx context.Context, c *client.Client, p *client.Producer, topic string, samples []Sample, progress func(int)) error {
	r, err := c.Route(ctx, topic)
	if err != nil {
		return fmt.Errorf("etl: produce: %w", err)
	}
	qs := r.PublishQueues()
	if len(qs) == 0 {
		return fmt.Errorf("etl: produce: topic %s has no writable queue", topic)
	}
	const batch = 128
	pending := make([][]*client.Message, len(qs))
	sent := 0
	flush := func(qi int) error {
		if len(pending[qi]) == 0 {
			return nil
		}
		if _, err := p.Send(ctx, pending[qi]...); err != nil {
			return fmt.Errorf("etl: produce: %w", err)
		}
		sent += len(pending[qi])
		pending[qi] = pending[qi][:0]
		if progress != nil {
			progress(sent)
		}
		return nil
	}
	for i := range samples {
		s := &samples[i]
		qi := int(fnv32(s.Customer) % uint32(len(qs)))
		q := qs[qi]
		pending[qi] = append(pending[qi], &client.Message{Topic: topic, Body: s.Body, Queue: &q})
		if len(pending[qi]) == batch {
			if err := flush(qi); err != nil {
				return err
			}
		}
	}
	for qi := range pending {
		if err := flush(qi); err != nil {
			return err
		}
	}
	return nil
}

func fnv32(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}

// ReadAll returns every committed message of topic (all queues, up to
// their max offsets now), in queue order then offset order. Half messages
// are invisible until committed, so this reads only committed output.
func ReadAll(ctx context.Context, c *client.Client, topic string) ([]protocol.MessageExt, error) {
	r, err := c.RefreshRoute(ctx, topic)
	if err != nil {
		return nil, err
	}
	var out []protocol.MessageExt
	for _, q := range r.SubscribeQueues() {
		end, err := c.MaxOffset(ctx, q)
		if err != nil {
			return nil, err
		}
		for off := int64(0); off < end; {
			res, err := c.Pull(ctx, client.PullRequest{Queue: q, Offset: off, Group: "etl_oracle", MaxMsgs: 32})
			if err != nil {
				return nil, err
			}
			if res.Status != client.PullFound {
				break
			}
			for i := range res.Messages {
				out = append(out, res.Messages[i].Clone())
			}
			off = res.NextBeginOffset
		}
	}
	return out, nil
}

// Count returns the number of committed messages of topic now (the sum of
// its queues' max offsets).
func Count(ctx context.Context, c *client.Client, topic string) (int64, error) {
	r, err := c.Route(ctx, topic)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, q := range r.SubscribeQueues() {
		m, err := c.MaxOffset(ctx, q)
		if err != nil {
			return 0, err
		}
		n += m
	}
	return n, nil
}

// Report is the oracle's verdict over the output and dead-letter topics.
type Report struct {
	Valid, Invalid int // input
	Output, DLQ    int // messages read
	// Missing valid orders, Duplicated output records, OutOfOrder records
	// (a customer's orders not in input order), WrongValue records (count,
	// amount_eur, key or lineage wrong), Unexpected output records (no such
	// valid order).
	Missing, Duplicated, OutOfOrder, WrongValue, Unexpected int
	// DLQMissing invalid orders, DLQDuplicated dead letters, DLQUnexpected
	// dead letters of valid orders or unknown bodies.
	DLQMissing, DLQDuplicated, DLQUnexpected int
	// Examples of problems (a few).
	Examples []string
}

// OK reports whether every valid order arrived exactly once, in order, with
// the right values, and every invalid one is in the DLQ exactly once.
func (r *Report) OK() bool {
	return r.Missing+r.Duplicated+r.OutOfOrder+r.WrongValue+r.Unexpected+r.DLQMissing+r.DLQDuplicated+r.DLQUnexpected == 0
}

func (r *Report) example(format string, args ...any) {
	if len(r.Examples) < 8 {
		r.Examples = append(r.Examples, fmt.Sprintf(format, args...))
	}
}

// String summarises the report.
func (r *Report) String() string {
	return fmt.Sprintf("input %d valid + %d invalid; output %d (missing %d, duplicated %d, out of order %d, wrong %d, unexpected %d); dlq %d (missing %d, duplicated %d, unexpected %d)",
		r.Valid, r.Invalid, r.Output, r.Missing, r.Duplicated, r.OutOfOrder, r.WrongValue, r.Unexpected,
		r.DLQ, r.DLQMissing, r.DLQDuplicated, r.DLQUnexpected)
}

// outBody is the output JSON as the oracle reads it.
type outBody struct {
	ID                 string   `json:"id"`
	Customer           string   `json:"customer"`
	Amount             float64  `json:"amount"`
	Currency           string   `json:"currency"`
	CustomerOrderCount int64    `json:"customer_order_count"`
	AmountEUR          *float64 `json:"amount_eur"`
}

// Verify is the oracle: it checks the committed output and dead letters
// (as read by ReadAll, in queue and offset order) against the input.
func Verify(samples []Sample, out, dlq []protocol.MessageExt) *Report {
	r := &Report{Output: len(out), DLQ: len(dlq)}
	byID := make(map[string]*Sample, len(samples))
	invalid := make(map[string]int) // body → count in input
	for i := range samples {
		s := &samples[i]
		if s.Valid {
			r.Valid++
			byID[s.ID] = s
		} else {
			r.Invalid++
			invalid[string(s.Body)]++
		}
	}
	seen := make(map[string]bool, len(byID))
	last := make(map[string]int64) // customer → last count seen
	for i := range out {
		m := &out[i]
		var b outBody
		if err := json.Unmarshal(m.Body, &b); err != nil {
			r.Unexpected++
			r.example("output %s is not the output schema: %v", m.Body, err)
			continue
		}
		s, ok := byID[b.ID]
		switch {
		case !ok:
			r.Unexpected++
			r.example("output of unknown order %q", b.ID)
			continue
		case seen[b.ID]:
			r.Duplicated++
			r.example("order %s output twice", b.ID)
			continue
		}
		seen[b.ID] = true
		if b.CustomerOrderCount != last[b.Customer]+1 {
			r.OutOfOrder++
			r.example("customer %s: count %d after %d", b.Customer, b.CustomerOrderCount, last[b.Customer])
		}
		last[b.Customer] = b.CustomerOrderCount
		eur := EUR(s.Amount, s.Currency)
		wrongEUR := (b.AmountEUR == nil) != math.IsNaN(float64(eur)) || (b.AmountEUR != nil && *b.AmountEUR != float64(eur))
		keys := m.Keys()
		_, hasEpoch := m.Property(mqsink.PropEpoch)
		_, hasOff := m.Property(mqsink.PropSrcOffset)
		if b.CustomerOrderCount != s.Seq || b.Customer != s.Customer || wrongEUR || keys != s.ID || !hasEpoch || !hasOff {
			r.WrongValue++
			r.example("order %s: count %d (want %d), eur %v (want %v), keys %v, epoch %v, offset %v", b.ID, b.CustomerOrderCount, s.Seq, b.AmountEUR, eur, keys, hasEpoch, hasOff)
		}
	}
	for id := range byID {
		if !seen[id] {
			r.Missing++
			r.example("order %s missing", id)
		}
	}
	got := make(map[string]int)
	for i := range dlq {
		got[string(dlq[i].Body)]++
	}
	for body, want := range invalid {
		n := got[body]
		switch {
		case n < want:
			r.DLQMissing += want - n
			r.example("invalid order %q missing from the DLQ", body)
		case n > want:
			r.DLQDuplicated += n - want
			r.example("invalid order %q in the DLQ %d times", body, n)
		}
	}
	for body, n := range got {
		if _, ok := invalid[body]; !ok {
			r.DLQUnexpected += n
			r.example("unexpected dead letter %q", body)
		}
	}
	return r
}
