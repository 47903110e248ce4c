// Package etl is runnel's exactly-once ETL job (examples/etl, `runnel
// demo`): orders (JSON) from a RocketMQ topic are decoded and validated
// (bad orders go to a dead-letter topic with their reason), enriched with
// keyed state (the customer's order count so far) and a fixed currency
// table, and written to an output topic, exactly once: half messages
// committed with each checkpoint (sink/rocketmq.ExactlyOnce), for the output
// and the dead-letter topic alike.
//
// # Contract
//
// Input: JSON {"id":"…","customer":"…","amount":12.5,"currency":"EUR","ts":"RFC3339"}.
// An order is valid when id and customer are non-empty, amount > 0 and
// currency is three upper-case letters; anything else (also a body that is
// not a JSON object) goes to the dead-letter topic.
//
// Output: one message per valid order, its body the order plus
// customer_order_count (the number of valid orders of that customer so far)
// and amount_eur (amount converted with Rates; null for a currency the
// table lacks); message key = the order id; properties runnel.src.topic,
// runnel.src.broker, runnel.src.queue, runnel.src.offset (the input
// message) and runnel.epoch. Orders of one customer stay in order when the
// input keeps them in one queue (produce them with the customer as
// sharding key): output is sharded by customer too.
package etl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	mqsink "github.com/runnel-dev/runnel/sink/rocketmq"
	srcmq "github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/state"
	"github.com/runnel-dev/runnel/transport/client"
)

// Defaults of the job's flags.
const (
	DefaultIn       = "orders"
	DefaultOut      = "orders-enriched"
	DefaultDLQ      = "orders-dlq"
	DefaultGroup    = "etl"
	DefaultInterval = time.Second
)

// Operator UIDs (stable across versions: they key checkpointed state).
const (
	UIDSource = "orders"
	UIDEnrich = "enrich"
	UIDOut    = "out"
	UIDDLQ    = "dlq"
)

// Rates is the fixed demo table of EUR per unit of each currency.
var Rates = map[string]float64{
	"EUR": 1, "USD": 0.92, "GBP": 1.17, "CHF": 1.04, "JPY": 0.0061, "SEK": 0.087, "NOK": 0.085,
	"DKK": 0.134, "PLN": 0.23, "CZK": 0.04, "CAD": 0.68, "AUD": 0.61, "CNY": 0.127,
}

// Order is one input order. Src is where it was read (not part of the
// JSON).
type Order struct {
	ID       string         `json:"id" validate:"required"`
	Customer string         `json:"customer" validate:"required"`
	Amount   float64        `json:"amount" validate:"gt=0"`
	Currency string         `json:"currency" validate:"len=3,uppercase,alpha"`
	TS       string         `json:"ts"`
	Src      mqsink.Lineage `json:"-"`
}

// Enriched is one output record.
type Enriched struct {
	Order
	CustomerOrderCount int64
	// AmountEUR is NaN when Rates lacks the currency.
	AmountEUR float64
}

// DecodeOrder decodes an input message into an Order (validation follows
// in the pipeline).
func DecodeOrder(m srcmq.Message) (Order, error) {
	if o, ok := decodeOrderFast(m.Body); ok {
		o.Src = mqsink.LineageOf(&m)
		return o, nil
	}
	var o Order // a variable of its own: &o escapes
	if err := json.Unmarshal(m.Body, &o); err != nil {
		return Order{}, fmt.Errorf("etl: order is not a JSON object of the schema: %w", err)
	}
	o.Src = mqsink.LineageOf(&m)
	return o, nil
}

// decodeOrderFast decodes the plain form of an order without reflection
// and with one allocation (the strings share one copy of b): an object
// whose keys are exactly the Order fields' names, string values without
// escapes, control characters or invalid UTF-8, and a JSON number for
// amount. It returns false for anything else (unknown or differently
// cased keys, null, escapes, other types, malformed JSON), which
// encoding/json then decodes: on what it accepts it gives json.Unmarshal's
// result.
func decodeOrderFast(b []byte) (Order, bool) {
	var o Order
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return o, false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return o, skipSpace(b, i+1) == len(b)
	}
	var src string // b copied once, on the first string value
	for {
		ks, ke, ok := scanString(b, i)
		if !ok {
			return o, false
		}
		key := b[ks:ke]
		i = skipSpace(b, ke+1)
		if i >= len(b) || b[i] != ':' {
			return o, false
		}
		i = skipSpace(b, i+1)
		if string(key) == "amount" {
			ne := scanNumber(b, i)
			if ne == i {
				return o, false
			}
			f, err := strconv.ParseFloat(string(b[i:ne]), 64)
			if err != nil {
				return o, false
			}
			o.Amount, i = f, ne
		} else {
			var dst *string
			switch string(key) {
			case "id":
				dst = &o.ID
			case "customer":
				dst = &o.Customer
			case "currency":
				dst = &o.Currency
			case "ts":
				dst = &o.TS
			default:
				return o, false
			}
			vs, ve, ok := scanString(b, i)
			if !ok {
				return o, false
			}
			if src == "" {
				src = string(b)
			}
			*dst, i = src[vs:ve], ve+1
		}
		i = skipSpace(b, i)
		if i >= len(b) {
			return o, false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return o, skipSpace(b, i+1) == len(b)
		default:
			return o, false
		}
	}
}

// skipSpace returns the index of the first byte at or after i that is not
// JSON whitespace.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// scanString scans a JSON string at b[i] that needs no unescaping: it
// returns the bounds of its content (b[e] is the closing quote), or false
// when b[i] starts no such string (escapes, control characters and
// invalid UTF-8 are left to encoding/json).
func scanString(b []byte, i int) (s, e int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return 0, 0, false
	}
	s = i + 1
	ascii := true
	for e = s; e < len(b); e++ {
		c := b[e]
		switch {
		case c == '"':
			return s, e, ascii || utf8.Valid(b[s:e])
		case c == '\\' || c < 0x20:
			return 0, 0, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return 0, 0, false
}

// scanNumber returns the end of the JSON number at b[i] (i when there is
// none): -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?.
func scanNumber(b []byte, i int) int {
	start := i
	digits := func(j int) int {
		for j < len(b) && b[j] >= '0' && b[j] <= '9' {
			j++
		}
		return j
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = digits(i + 1)
	default:
		return start
	}
	if i < len(b) && b[i] == '.' {
		j := digits(i + 1)
		if j == i+1 {
			return start
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		j := i + 1
		if j < len(b) && (b[j] == '+' || b[j] == '-') {
			j++
		}
		k := digits(j)
		if k == j {
			return start
		}
		i = k
	}
	return i
}

// EUR converts amount in currency to euros (cents rounded), NaN when the
// currency is unknown.
func EUR(amount float64, currency string) float64 {
	r, ok := Rates[currency]
	if !ok {
		return math.NaN()
	}
	return math.Round(amount*r*100) / 100
}

// AppendJSON appends the output body of e.
func AppendJSON(b []byte, e *Enriched) []byte {
	b = append(b, `{"id":`...)
	b = appendJSONString(b, e.ID)
	b = append(b, `,"customer":`...)
	b = appendJSONString(b, e.Customer)
	b = append(b, `,"amount":`...)
	b = strconv.AppendFloat(b, e.Amount, 'f', -1, 64)
	b = append(b, `,"currency":`...)
	b = appendJSONString(b, e.Currency)
	b = append(b, `,"ts":`...)
	b = appendJSONString(b, e.TS)
	b = append(b, `,"customer_order_count":`...)
	b = strconv.AppendInt(b, e.CustomerOrderCount, 10)
	b = append(b, `,"amount_eur":`...)
	if math.IsNaN(e.AmountEUR) || math.IsInf(e.AmountEUR, 0) {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendFloat(b, e.AmountEUR, 'f', -1, 64)
	}
	return append(b, '}')
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string (invalid UTF-8 becomes
// U+FFFD).
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+n]...)
		}
		i += n
	}
	return append(b, '"')
}

// outMessage is an output message together with the storage of its keys
// and (unless it is longer) its body: one allocation instead of three.
type outMessage struct {
	m    client.Message
	keys [1]string
	body [outBodyCap]byte
}

// outBodyCap holds the body of a typical order.
const outBodyCap = 192

// OutputMessage is the message the job writes for e.
func OutputMessage(topic string, e *Enriched) *client.Message {
	o := new(outMessage)
	o.keys[0] = e.ID
	b := AppendJSON(o.body[:0], e)
	o.m = client.Message{Topic: topic, Body: b[:len(b):len(b)], Keys: o.keys[:], ShardingKey: e.Customer}
	e.Src.SetOn(&o.m)
	return &o.m
}

// DeadLetterMessage is the message the job writes to topic for an order
// read from inTopic and rejected: sink/rocketmq's dead-letter message plus
// the lineage properties.
func DeadLetterMessage(topic, inTopic string, d sink.DeadLetter) *client.Message {
	m := mqsink.DeadLetterMessage(topic, d)
	if b, q, ok := strings.Cut(d.Split, "/"); ok {
		if qid, err := strconv.ParseInt(q, 10, 32); err == nil {
			l := mqsink.Lineage{Topic: inTopic, Broker: b, Queue: int32(qid), Offset: -1}
			if o, err := srcmq.DecodeOffset(d.Offset); err == nil && o.Next > 0 {
				l.Offset = o.Next - 1
			}
			l.SetOn(m)
		}
	}
	return m
}

// Config configures the job.
type Config struct {
	// In, Out and DLQ are the topics (defaults DefaultIn, DefaultOut,
	// DefaultDLQ).
	In, Out, DLQ string
	// Group names the job (pipeline.New's name): its consumer group, its
	// sinks' producer groups (sink/rocketmq.TxGroup(Group, sink UID), bound
	// from the job) and its checkpoint fingerprint (default DefaultGroup).
	Group string
	// StateDir is the checkpoint directory (required: it is what makes a
	// restart resume).
	StateDir string
	// CheckpointInterval (default DefaultInterval).
	CheckpointInterval time.Duration
	// Parallelism of the enrich operator (0: GOMAXPROCS).
	Parallelism int
	// Bounded stops the job at the input's offsets when first opened
	// (benchmarks, tests).
	Bounded bool
	// AtLeastOnce replaces the exactly-once sinks with at-least-once ones
	// (sink/rocketmq.New), for comparison.
	AtLeastOnce bool
	// SinkOptions are passed to both exactly-once sinks (tests: phase
	// hooks, a shortened discard window).
	SinkOptions []mqsink.TxOption
	// Logger (nil discards).
	Logger *slog.Logger

	// SingleProcess runs the job in this process alone (pipeline.Job.Run)
	// instead of as one worker of many (pipeline.RunWorker, the default:
	// every process started with the same Group shares the work).
	SingleProcess bool
	// Partitioned declares that the input is partitioned by customer (all
	// orders of a customer on one queue, as Produce sends them): workers
	// then count each customer in its queue's task instead of sending the
	// orders through a repartition topic. Wrong counts result if the input
	// is not.
	Partitioned bool
	// Ranges and Standbys are the workers' pipeline.Ranges and
	// pipeline.Standbys (0: their defaults).
	Ranges, Standbys int
	// StatusAddr serves the worker's status there ("" none); OnStatusAddr
	// is told its address.
	StatusAddr   string
	OnStatusAddr func(string)
	// WorkerOptions are added to the workers' options (tests).
	WorkerOptions []pipeline.JobOption
}

func (c *Config) logger() *slog.Logger {
	if c.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Logger
}

func (c *Config) defaults() error {
	c.In = cmpOr(c.In, DefaultIn)
	c.Out = cmpOr(c.Out, DefaultOut)
	c.DLQ = cmpOr(c.DLQ, DefaultDLQ)
	c.Group = cmpOr(c.Group, DefaultGroup)
	if c.CheckpointInterval == 0 {
		c.CheckpointInterval = DefaultInterval
	}
	switch {
	case c.StateDir == "":
		return errors.New("etl: a state directory is required")
	case c.CheckpointInterval < 0:
		return errors.New("etl: negative checkpoint interval")
	}
	return nil
}

func cmpOr(a, b string) string {
	if a == "" {
		return b
	}
	return a
}

// Run runs the job on c until ctx is cancelled (then it takes a final
// checkpoint and returns nil) or, with Bounded, until the input is
// consumed. It fails on any sink error: nothing is dropped.
func Run(ctx context.Context, c *client.Client, cfg Config) (err error) {
	if err := cfg.defaults(); err != nil {
		return err
	}
	if !cfg.SingleProcess {
		return runWorker(ctx, c, cfg)
	}
	log := cfg.logger()
	var alo *client.Producer
	if cfg.AtLeastOnce {
		if alo, err = client.NewProducer(c, cfg.Group+"_alo", client.WithSelector(client.HashBySharding())); err != nil {
			return err
		}
		defer func() { err = errors.Join(err, alo.Close()) }()
	}
	// Each exactly-once sink's producer group comes from the job, which
	// binds it: its name and the sink's UID (TxGroup(Group, UID)).
	out, dlq, err := cfg.sinks(c, alo)
	if err != nil {
		return err
	}
	src, err := cfg.source(c)
	if err != nil {
		return errors.Join(err, out.Close(), dlq.Close())
	}
	jopts := []pipeline.JobOption{pipeline.CheckpointDir(cfg.StateDir), pipeline.CheckpointInterval(cfg.CheckpointInterval),
		pipeline.Logger(log)}
	if cfg.Parallelism > 0 {
		jopts = append(jopts, pipeline.DefaultParallelism(cfg.Parallelism))
	}
	job := pipeline.New(cfg.Group, jopts...)
	Build(job, src, out, dlq)
	return job.Run(ctx)
}

// Build adds the ETL graph to job: src → decode + validate (bad orders to
// dlq) → KeyBy customer → enrich → out.
func Build(job *pipeline.Job, src *srcmq.Source, out sink.Sink[Enriched], dlq sink.Sink[sink.DeadLetter]) {
	build(job, src, out, dlq, false)
}

func build(job *pipeline.Job, src *srcmq.Source, out sink.Sink[Enriched], dlq sink.Sink[sink.DeadLetter], partitioned bool) {
	bad := pipeline.DeadLetter(UIDDLQ, dlq)
	orders := pipeline.FromSourceDecoded(job, UIDSource, src, DecodeOrder, pipeline.OnBadRecord(bad), pipeline.NoWatermarks())
	byCustomer := pipeline.KeyBy(orders, func(o Order) string { return o.Customer }).WithCodec(OrderCodec())
	if partitioned {
		byCustomer = byCustomer.PrePartitioned()
	}
	enriched := pipeline.Process(byCustomer, UIDEnrich,
		func() pipeline.KeyedProcessFunc[string, Order, Enriched] { return &enrich{} }, pipeline.OnError(bad))
	pipeline.To(enriched, UIDOut, out)
}

// enrich counts each customer's valid orders in keyed state.
type enrich struct{ n *state.Value[int64] }

func (f *enrich) Open(ctx *pipeline.OpenContext) (err error) {
	f.n, err = state.NewValue(ctx.Backend(), "orders", state.Int64Codec())
	return err
}

func (f *enrich) ProcessElement(ctx *pipeline.KeyedContext[string, Enriched], o Order) error {
	n, _, err := f.n.Get()
	if err != nil {
		return err
	}
	n++
	if err := f.n.Set(n); err != nil {
		return err
	}
	return ctx.Emit(Enriched{Order: o, CustomerOrderCount: n, AmountEUR: EUR(o.Amount, o.Currency)})
}

func (f *enrich) OnTimer(*pipeline.KeyedContext[string, Enriched], pipeline.Timer) error { return nil }
