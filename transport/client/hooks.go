package client

import (
	"context"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// Hook is a value that implements one or more of the Hook* interfaces of
// this package (HookProduce, HookProduced, HookPull, HookConsume,
// HookConsumed). Hooks are given to
// WithHooks; the Client type-asserts each one once, at New, so a hook only
// pays for the interfaces it implements and new hook interfaces never break
// existing hooks (franz-go's kgo.Hook). Hooks are called synchronously on the
// goroutine named by each interface and must not block; they must be safe
// for concurrent use (sends and pulls run concurrently).
type Hook any

// HookProduce is called once per Send, SendAsync or SendOneway call, on the
// caller's goroutine, before the messages are validated and encoded (so it
// must tolerate invalid messages: a validation error reaches HookProduced).
// It may add user properties to every message of the call through
// props (trace context propagation); the messages themselves must not be
// modified. It returns the context that HookProduced receives for this call
// (ctx itself when it has nothing to carry).
type HookProduce interface {
	OnProduce(ctx context.Context, topic string, msgs []*Message, props *Injector) context.Context
}

// HookProduced is called once per send call when its outcome is known: for
// Send and SendOneway on the caller's goroutine before the call returns, for
// SendAsync on the goroutine that runs the callback, just before it. ctx is
// the one HookProduce returned (the call's ctx without a HookProduce); n is
// the number of messages. res is zero when err is not nil, and for oneway
// sends.
type HookProduced interface {
	OnProduced(ctx context.Context, topic string, n int, res SendResult, err error)
}

// HookPull is called after every Client.Pull, on the caller's goroutine,
// with the request, the result (nil when err is not nil) and how long the
// pull took (including the broker's long-poll suspension).
type HookPull interface {
	OnPull(ctx context.Context, req *PullRequest, res *PullResult, took time.Duration, err error)
}

// HookConsume is called by a PushConsumer for each message it is about to
// hand to its handler, on the worker goroutine that will call the handler.
// It returns the message's context (ConsumedMessage.Context): ctx, or ctx
// carrying what the hook extracted from the message's properties (the
// producer's trace, for a span around the handler). m must not be modified.
type HookConsume interface {
	OnConsume(ctx context.Context, group string, m *protocol.MessageExt) context.Context
}

// HookConsumed is called by a PushConsumer for each message after its
// handler call returned, on the worker goroutine, with the message's
// context (the one HookConsume returned), the verdict and the call's
// duration.
type HookConsumed interface {
	OnConsumed(ctx context.Context, group string, m *protocol.MessageExt, result ConsumeResult, took time.Duration)
}

// WithHooks adds hooks to the Client and to every Producer created on it.
// Values that implement none of the Hook* interfaces are ignored.
func WithHooks(hooks ...Hook) Option {
	return optionFunc(func(c *config) {
		for _, h := range hooks {
			c.hooks.add(h)
		}
	})
}

// Injector collects the user properties a HookProduce adds to the messages
// of one send call. It is valid only during OnProduce and is not safe for
// concurrent use.
type Injector struct {
	kv []string
}

// Set adds (or replaces) property name with value. Names and values must
// not contain the property separators (\x01, \x02); such a pair is ignored.
// Properties a message sets itself with the same name are not removed: use
// names the application does not use (traceparent, tracestate, baggage).
func (in *Injector) Set(name, value string) {
	if name == "" || !validPropertyText(name) || !validPropertyText(value) {
		return
	}
	for i := 0; i+1 < len(in.kv); i += 2 {
		if in.kv[i] == name {
			in.kv[i+1] = value
			return
		}
	}
	in.kv = append(in.kv, name, value)
}

// Get returns the value Set gave name ("" when none).
func (in *Injector) Get(name string) string {
	for i := 0; i+1 < len(in.kv); i += 2 {
		if in.kv[i] == name {
			return in.kv[i+1]
		}
	}
	return ""
}

// Keys returns the names Set so far.
func (in *Injector) Keys() []string {
	keys := make([]string, 0, len(in.kv)/2)
	for i := 0; i+1 < len(in.kv); i += 2 {
		keys = append(keys, in.kv[i])
	}
	return keys
}

func validPropertyText(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == protocol.PropNameValueSeparator || s[i] == protocol.PropSeparator {
			return false
		}
	}
	return true
}

// clientHooks are the type-asserted hooks of a Client.
type clientHooks struct {
	produce  []HookProduce
	produced []HookProduced
	pull     []HookPull
	consume  []HookConsume
	consumed []HookConsumed
}

func (h *clientHooks) add(x Hook) {
	if p, ok := x.(HookProduce); ok {
		h.produce = append(h.produce, p)
	}
	if p, ok := x.(HookProduced); ok {
		h.produced = append(h.produced, p)
	}
	if p, ok := x.(HookPull); ok {
		h.pull = append(h.pull, p)
	}
	if p, ok := x.(HookConsume); ok {
		h.consume = append(h.consume, p)
	}
	if p, ok := x.(HookConsumed); ok {
		h.consumed = append(h.consumed, p)
	}
}

func (h *clientHooks) sendHooked() bool { return len(h.produce) > 0 || len(h.produced) > 0 }

// beforeSend runs the produce hooks of a send call. It returns the ctx for
// the call (and its HookProduced) and the properties to add to every message.
func (p *Producer) beforeSend(ctx context.Context, msgs []*Message) (context.Context, []string) {
	hs := p.c.cfg.hooks.produce
	if len(hs) == 0 || len(msgs) == 0 || msgs[0] == nil {
		return ctx, nil
	}
	in := injectors.Get().(*Injector)
	for _, h := range hs {
		ctx = h.OnProduce(ctx, msgs[0].Topic, msgs, in)
	}
	var kv []string
	if len(in.kv) > 0 {
		kv = append([]string(nil), in.kv...) // the pooled Injector is reused
	}
	clear(in.kv)
	in.kv = in.kv[:0]
	injectors.Put(in)
	return ctx, kv
}

// injectors pools the Injectors of send calls (stateless between uses).
var injectors = sync.Pool{New: func() any { return new(Injector) }}

// afterSend runs the produced hooks of a send call.
func (p *Producer) afterSend(ctx context.Context, topic string, n int, res SendResult, err error) {
	for _, h := range p.c.cfg.hooks.produced {
		h.OnProduced(ctx, topic, n, res, err)
	}
}

// sendTopic is the topic of a send call's messages, for the hooks.
func sendTopic(msgs []*Message) string {
	if len(msgs) == 0 || msgs[0] == nil {
		return ""
	}
	return msgs[0].Topic
}

// pullHooked runs a pull and the pull hooks.
func (c *Client) pullHooked(ctx context.Context, req PullRequest) (*PullResult, error) {
	start := time.Now()
	res, err := c.pull(ctx, req)
	took := time.Since(start)
	for _, h := range c.cfg.hooks.pull {
		h.OnPull(ctx, &req, res, took, err)
	}
	return res, err
}
