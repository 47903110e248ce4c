package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// Request/reply (RocketMQ 4.6+, protocol reference §7.10). A request is an
// ordinary message carrying CORRELATION_ID (a fresh UUID), REPLY_TO_CLIENT
// (the requester's client id) and TTL (its timeout in ms). The replier
// consumes it and sends a reply made by NewReplyMessage (MSG_TYPE=reply,
// the same correlation id and requester, to <cluster>_REPLY_TOPIC, the
// cluster being the request's CLUSTER property, which brokers add) with
// SEND_REPLY_MESSAGE_V2; the broker stores the reply and pushes it to the
// requester (PUSH_REPLY_MESSAGE_TO_CLIENT) over the connection of the
// producer that heartbeated with that client id. The requester matches it
// by correlation id. Java's DefaultMQProducer.request and
// MessageUtil.createReplyMessage do the same.

// replyMessageFlag is MSG_TYPE's value for replies (Java MixAll).
const replyMessageFlag = "reply"

// replyTopicSuffix ends the reply topic's name (Java
// MixAll.REPLY_TOPIC_POSTFIX).
const replyTopicSuffix = "REPLY_TOPIC"

// ErrRequestTimeout is returned by Request (and given to RequestAsync's
// callback) when no reply came within the request's timeout.
var ErrRequestTimeout = errors.New("client: request timed out waiting for its reply")

// ReplyTopic returns the reply topic of cluster: "<cluster>_REPLY_TOPIC".
func ReplyTopic(cluster string) string { return cluster + "_" + replyTopicSuffix }

// NewReplyMessage returns the reply to request with body (Java's
// MessageUtil.createReplyMessage): to the reply topic of the request's
// cluster, with MSG_TYPE=reply and the request's CORRELATION_ID,
// REPLY_TO_CLIENT and TTL. Send it with any Producer (it goes out as
// SEND_REPLY_MESSAGE_V2). The request must have come through a broker
// (which adds CLUSTER): an error wrapping ErrInvalidMessage otherwise.
func NewReplyMessage(request *protocol.MessageExt, body []byte) (*Message, error) {
	cluster, _ := request.Property(protocol.PropCluster)
	if cluster == "" {
		return nil, fmt.Errorf("%w: create reply message fail, requestMessage error, property[%s] is null", ErrInvalidMessage, protocol.PropCluster)
	}
	props := map[string]string{protocol.PropMsgType: replyMessageFlag}
	for _, k := range []string{protocol.PropCorrelationID, protocol.PropReplyToClient, protocol.PropTTL} {
		if v, ok := request.Property(k); ok {
			props[k] = v
		}
	}
	return &Message{Topic: ReplyTopic(cluster), Body: body, Properties: props}, nil
}

// requestTable holds the requests of a Client waiting for their replies.
type requestTable struct {
	mu         sync.Mutex
	m          map[string]*replyWaiter
	registered bool // the PUSH_REPLY_MESSAGE_TO_CLIENT handler is installed
	closed     bool
}

type replyWaiter struct {
	cb func(*protocol.MessageExt, error)

	mu    sync.Mutex
	timer *time.Timer
	done  bool
}

// complete calls cb once (the first outcome wins) and stops the timer.
func (w *replyWaiter) complete(m *protocol.MessageExt, err error) {
	w.mu.Lock()
	if w.done {
		w.mu.Unlock()
		return
	}
	w.done = true
	if w.timer != nil {
		w.timer.Stop()
	}
	w.mu.Unlock()
	w.cb(m, err)
}

// expireAfter arms the request's timeout unless it completed already.
func (w *replyWaiter) expireAfter(d time.Duration, expire func()) {
	w.mu.Lock()
	if !w.done {
		w.timer = time.AfterFunc(d, expire)
	}
	w.mu.Unlock()
}

func (t *requestTable) take(id string) *replyWaiter {
	t.mu.Lock()
	defer t.mu.Unlock()
	w := t.m[id]
	delete(t.m, id)
	return w
}

// failAll completes every waiting request with err (Client.Close).
func (t *requestTable) failAll(err error) {
	t.mu.Lock()
	ws := t.m
	t.m, t.closed = nil, true
	t.mu.Unlock()
	for _, w := range ws {
		w.complete(nil, err)
	}
}

// newCorrelationID returns a random (version 4) UUID string, as Java's
// CorrelationIdUtil.createCorrelationId.
func newCorrelationID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:], b[10:])
	return string(s[:])
}

// Request sends m as a request and waits for its reply, which it returns
// (its Topic is the reply topic; Body and Properties are the replier's).
// The request's timeout (its TTL) is ctx's deadline, or the producer's send
// timeout (the Client's request timeout, 3 s) without one; no reply by then
// is ErrRequestTimeout. A failed send is returned as Send returns it (there
// is no retry: a request may have been delivered). The broker must know
// this client as a producer (Request sends a heartbeat first to brokers
// it has not heartbeated since the producer was made).
func (p *Producer) Request(ctx context.Context, m *Message) (*protocol.MessageExt, error) {
	type result struct {
		m   *protocol.MessageExt
		err error
	}
	ch := make(chan result, 1)
	p.RequestAsync(ctx, m, func(r *protocol.MessageExt, err error) { ch <- result{r, err} })
	r := <-ch
	return r.m, r.err
}

// RequestAsync sends m as a request (see Request) and calls cb exactly
// once with the reply or the error (ErrRequestTimeout, a send failure,
// ErrClosed). It blocks to validate, route and hand the request to the
// connection; cb runs on the goroutine that delivered the reply, the
// send's outcome or the timeout, and must not block.
func (p *Producer) RequestAsync(ctx context.Context, m *Message, cb func(*protocol.MessageExt, error)) {
	if m == nil {
		cb(nil, fmt.Errorf("%w: nil message", ErrInvalidMessage))
		return
	}
	ttl := p.cfg.sendTimeout
	if ttl == 0 {
		ttl = p.c.cfg.requestTimeout
	}
	if dl, ok := ctx.Deadline(); ok {
		ttl = time.Until(dl)
	}
	if ttl <= 0 {
		cb(nil, fmt.Errorf("%w: %w", ErrRequestTimeout, context.DeadlineExceeded))
		return
	}
	if err := p.c.ensureReplyHandler(); err != nil {
		cb(nil, err)
		return
	}
	p.announce(ctx, m.Topic) // the broker pushes the reply over this producer's channel
	id := newCorrelationID()
	w := &replyWaiter{cb: cb}
	t := &p.c.requests
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		cb(nil, ErrClosed)
		return
	}
	if t.m == nil {
		t.m = make(map[string]*replyWaiter)
	}
	t.m[id] = w
	t.mu.Unlock()
	w.expireAfter(ttl, func() {
		if w := t.take(id); w != nil {
			w.complete(nil, ErrRequestTimeout)
		}
	})
	inject := []string{protocol.PropCorrelationID, id, protocol.PropReplyToClient, p.c.ClientID(),
		protocol.PropTTL, strconv.FormatInt(max(ttl.Milliseconds(), 1), 10)}
	var ob outbound
	if err := p.prepare(&ob, []*Message{m}, false, inject...); err != nil {
		if w := t.take(id); w != nil {
			w.complete(nil, err)
		}
		return
	}
	defer p.release(&ob)
	q, addr, err := p.pick(ctx, &ob, "")
	if err != nil {
		if w := t.take(id); w != nil {
			w.complete(nil, err)
		}
		return
	}
	p.sendPickedAsync(ctx, &ob, q, addr, func(_ SendResult, err error) {
		if err != nil {
			if w := t.take(id); w != nil {
				w.complete(nil, err)
			}
		}
	}, nil)
}

// ensureReplyHandler installs the PUSH_REPLY_MESSAGE_TO_CLIENT handler once.
func (c *Client) ensureReplyHandler() error {
	t := &c.requests
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || c.closed.Load() {
		return ErrClosed
	}
	if !t.registered {
		t.registered = true
		c.handleServerRequest(protocol.ReqPushReplyMessageToClient, c.onReply)
	}
	return nil
}

// onReply handles PUSH_REPLY_MESSAGE_TO_CLIENT (Java
// ClientRemotingProcessor.receiveReplyMessage): the reply is decoded
// (decompressed), ARRIVE_TIME added, and handed to the request with its
// correlation id; a reply nobody waits for is logged. The answer is
// SUCCESS, or SYSTEM_ERROR for a push that cannot be decoded.
func (c *Client) onReply(_ context.Context, addr string, req *protocol.Command) *protocol.Command {
	m, err := decodeReply(req)
	if err != nil {
		c.log.Warn("client: bad reply push", "broker", addr, "err", err)
		return protocol.NewResponse(req, protocol.ResSystemError, err.Error())
	}
	id, _ := m.Property(protocol.PropCorrelationID)
	if w := c.requests.take(id); w != nil {
		w.complete(m, nil)
	} else {
		c.log.Warn("client: reply matches no waiting request", "broker", addr, "correlationId", id)
	}
	return protocol.NewResponse(req, protocol.ResSuccess, "")
}

func decodeReply(req *protocol.Command) (*protocol.MessageExt, error) {
	var h protocol.ReplyMessageRequestHeader
	if err := h.Decode(req); err != nil {
		return nil, err
	}
	m := &protocol.MessageExt{
		Topic:          h.Topic,
		QueueID:        h.QueueID,
		SysFlag:        h.SysFlag,
		BornTimestamp:  h.BornTimestamp,
		Flag:           h.Flag,
		ReconsumeTimes: h.ReconsumeTimes.V,
		StoreTimestamp: h.StoreTimestamp,
		Body:           append([]byte(nil), req.Body...),
	}
	var err error
	if m.BornHost, err = netip.ParseAddrPort(h.BornHost); err != nil {
		return nil, fmt.Errorf("reply bornHost %q: %w", h.BornHost, err)
	}
	if m.StoreHost, err = netip.ParseAddrPort(h.StoreHost); err != nil {
		return nil, fmt.Errorf("reply storeHost %q: %w", h.StoreHost, err)
	}
	if m.Compressed() {
		if m.Body, err = m.DecompressedBody(protocol.MaxBodySize); err != nil {
			return nil, fmt.Errorf("reply body: %w", err)
		}
		m.SysFlag &^= protocol.SysFlagCompressed | protocol.SysFlagCompressionMask
	}
	props := protocol.AppendPropertiesExcept(nil, h.Properties, protocol.PropArriveTime)
	props = protocol.AppendProperty(props, protocol.PropArriveTime, strconv.FormatInt(time.Now().UnixMilli(), 10))
	m.Properties = string(props)
	return m, nil
}
