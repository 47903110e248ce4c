package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// TxState is a transaction's outcome as a check listener reports it.
type TxState int

// Transaction states.
const (
	// TxUnknown leaves the half message pending: the broker asks again later.
	TxUnknown TxState = iota
	// TxCommit makes the half message visible to consumers.
	TxCommit
	// TxRollback discards the half message.
	TxRollback
)

// WithCheckListener answers the broker's transaction check-backs
// (CHECK_TRANSACTION_STATE) for this producer's group: fn gets the half
// message and its answer is sent as END_TRANSACTION with
// fromTransactionCheck=true (nothing is sent for TxUnknown). fn runs on a
// connection handler goroutine, one call per check; ctx is cancelled when
// that connection closes. msg aliases the request and is valid only during
// the call.
func WithCheckListener(fn func(ctx context.Context, msg *protocol.MessageExt) TxState) ProducerOption {
	return producerOptionFunc(func(c *producerConfig) { c.checkListener, c.checkListenSet = fn, true })
}

// TxHandle identifies a half message so that its transaction can be ended
// later, possibly by another process: it is plain data, and its JSON form
// can be stored (in a checkpoint) and restored.
type TxHandle struct {
	ProducerGroup string `json:"producerGroup"`
	Topic         string `json:"topic"`
	BrokerName    string `json:"brokerName"`
	BrokerAddr    string `json:"brokerAddr"`
	// QueueID is the queue of Topic the message goes to once committed.
	QueueID int32 `json:"queueId"`
	// TranStateTableOffset is the half message's offset in the half queue.
	TranStateTableOffset int64 `json:"tranStateTableOffset"`
	// CommitLogOffset is the half message's physical offset.
	CommitLogOffset int64  `json:"commitLogOffset"`
	MsgID           string `json:"msgId"` // UNIQ_KEY
	TransactionID   string `json:"transactionId"`
	OffsetMsgID     string `json:"offsetMsgId"`
	// Status is the status the broker stored the half message with:
	// SendOK, or stored on the master but not yet flushed or replicated
	// (Apache RocketMQ's transactional producer rolls such a half message
	// back). Not part of the handle's JSON.
	Status SendStatus `json:"-"`
}

// SendHalf sends msg as a transactional half message: the broker stores it
// without delivering it until EndTransaction commits it (or a check-back
// answer does). It retries like Send, but only after failures that surely
// did not store the message; when MaybeApplied(err), an orphan half message
// may exist and will be checked back.
func (p *Producer) SendHalf(ctx context.Context, msg *Message) (TxHandle, error) {
	return p.SendHalfWith(ctx, msg, nil)
}

// SendHalfWith is SendHalf with props, name/value pairs, carried as if
// they were in msg.Properties (after them: a name in both takes props'
// value) and checked like them. A caller that adds the same few
// properties to every message it sends (an exactly-once sink tags each
// with its epoch and task) need not grow every message's map for them.
func (p *Producer) SendHalfWith(ctx context.Context, msg *Message, props []string) (TxHandle, error) {
	if err := validatePairs(props); err != nil {
		return TxHandle{}, err
	}
	var ob outbound
	if err := p.prepare(&ob, []*Message{msg}, true, props...); err != nil {
		return TxHandle{}, err
	}
	defer p.release(&ob)
	if p.cfg.checkListener != nil {
		p.announce(ctx, ob.topic)
	}
	res, err := p.sendSync(ctx, &ob, true)
	if err != nil {
		return TxHandle{}, err
	}
	return p.halfHandle(msg.Topic, res)
}

// halfHandle returns the handle of the half message res acknowledged.
func (p *Producer) halfHandle(topic string, res SendResult) (TxHandle, error) {
	_, phys, err := protocol.ParseOffsetMsgID(res.OffsetMsgID)
	if err != nil {
		return TxHandle{}, fmt.Errorf("client: half message stored on %s but its offset id %q is invalid: %w", res.BrokerAddr, res.OffsetMsgID, err)
	}
	txID := res.TransactionID
	if txID == "" {
		txID = res.MsgID
	}
	return TxHandle{
		ProducerGroup:        p.group,
		Topic:                topic,
		BrokerName:           res.Queue.BrokerName,
		BrokerAddr:           res.BrokerAddr,
		QueueID:              res.Queue.QueueID,
		TranStateTableOffset: res.QueueOffset,
		CommitLogOffset:      phys,
		MsgID:                res.MsgID,
		TransactionID:        txID,
		OffsetMsgID:          res.OffsetMsgID,
		Status:               res.Status,
	}, nil
}

// SendHalfAsync sends msg as a half message like SendHalf, without waiting
// for the broker: cb is called exactly once with the handle or the error.
// It blocks only to validate, resolve the route and wait for room on the
// connection (bounded by ctx); ctx also bounds the wait for the answer
// (without a deadline, the send timeout). There is no retry: after an
// error, MaybeApplied(err) tells whether an orphan half message may exist
// (it will be checked back). cb runs on the connection's reader goroutine
// (or on the caller's when the send fails early) and must not block; it
// must not call Client.Close.
func (p *Producer) SendHalfAsync(ctx context.Context, msg *Message, cb func(TxHandle, error)) {
	p.SendHalfAsyncTo(ctx, msg, halfFunc(cb))
}

// HalfCallback receives the outcome of SendHalfAsyncTo.
type HalfCallback interface {
	// HalfSent gets the handle of the stored half message, or the error.
	HalfSent(h TxHandle, err error)
}

// halfFunc adapts a function to HalfCallback.
type halfFunc func(TxHandle, error)

func (f halfFunc) HalfSent(h TxHandle, err error) { f(h, err) }

// SendHalfAsyncTo is SendHalfAsync with its outcome given to cb.HalfSent:
// a caller that keeps per-message state in a value it already allocated
// (a pointer implementing HalfCallback) sends without allocating a
// closure per message. The same rules as SendHalfAsync's callback apply.
func (p *Producer) SendHalfAsyncTo(ctx context.Context, msg *Message, cb HalfCallback) {
	p.SendHalfAsyncWith(ctx, msg, nil, cb)
}

// SendHalfAsyncWith is SendHalfAsyncTo with props carried as SendHalfWith
// carries them.
func (p *Producer) SendHalfAsyncWith(ctx context.Context, msg *Message, props []string, cb HalfCallback) {
	if p.closed.Load() {
		cb.HalfSent(TxHandle{}, ErrClosed)
		return
	}
	if err := validatePairs(props); err != nil {
		cb.HalfSent(TxHandle{}, err)
		return
	}
	var ob outbound
	if err := p.prepare(&ob, []*Message{msg}, true, props...); err != nil {
		cb.HalfSent(TxHandle{}, err)
		return
	}
	defer p.release(&ob)
	if p.cfg.checkListener != nil {
		p.announce(ctx, ob.topic)
	}
	q, addr, err := p.pick(ctx, &ob, "")
	if err != nil {
		cb.HalfSent(TxHandle{}, err)
		return
	}
	p.sendPickedAsync(ctx, &ob, q, addr, nil, cb)
}

// announce sends a heartbeat carrying this producer's group to the
// masters of topic's route it has not yet told, so that check-backs can
// reach the producer from its first half message on.
func (p *Producer) announce(ctx context.Context, topic string) {
	r, err := p.c.publishRoute(ctx, topic, p.cfg.defQueueNums)
	if err != nil {
		return
	}
	for _, addr := range r.masters {
		if _, done := p.hbSent.Load(addr); done {
			continue
		}
		hb := protocol.HeartbeatData{ClientID: p.c.clientID, ProducerDataSet: []protocol.ProducerData{{GroupName: p.group}}}
		body, err := hb.Encode()
		if err != nil {
			return
		}
		req := protocol.NewRequest(protocol.ReqHeartbeat)
		req.Body = body
		if resp, err := p.c.invoke(ctx, addr, req); err == nil && resp.Code == protocol.ResSuccess {
			p.hbSent.Store(addr, struct{}{})
		}
	}
}

// EndTransaction commits (commit=true) or rolls back the half message h
// identifies, and waits for the broker's answer. It goes to the current
// master of h.BrokerName (h.BrokerAddr when the route does not name one).
// Do not commit a half message twice on Apache RocketMQ brokers (4.9 and
// 5.x): they find the half message by its commit log offset whether or not
// it was ended, and store the message again for every commit (a commit
// answered to a later check-back too); runnel's broker answers a repeat of
// the same end as done. A broker without transaction support yields an
// error wrapping ErrTxUnsupported.
func (p *Producer) EndTransaction(ctx context.Context, h TxHandle, commit bool) error {
	addr, req, err := p.endRequest(ctx, &h, commit)
	if err != nil {
		return err
	}
	defer p.putCmd(req)
	resp, err := p.c.invoke(ctx, addr, req)
	return endResult(resp, err, addr, h.MsgID)
}

// EndTransactionAsync ends the transaction of h like EndTransaction,
// without waiting for the broker: cb is called exactly once, with nil or
// the error EndTransaction would have returned, so that many transactions
// can be ended over one connection at once. It blocks only to resolve the
// route and connect and to wait for room on the connection (bounded by
// ctx); ctx also bounds the wait for the answer (without a deadline, the
// client's request timeout). There is no retry. cb runs on the
// connection's reader goroutine (or on the caller's when the request
// fails before it is sent) and must not block; it must not call
// Client.Close. Requests to one broker are written in call order, but a
// broker may process them in any order: end the next transaction that
// must follow this one only after cb.
func (p *Producer) EndTransactionAsync(ctx context.Context, h TxHandle, commit bool, cb func(error)) {
	addr, req, err := p.endRequest(ctx, &h, commit)
	if err != nil {
		cb(err)
		return
	}
	defer p.putCmd(req)
	cn, err := p.c.conn(ctx, addr)
	if err != nil {
		cb(endResult(nil, err, addr, h.MsgID))
		return
	}
	var timeout time.Duration
	if _, ok := ctx.Deadline(); !ok {
		timeout = p.c.cfg.requestTimeout
	}
	p.c.sign(req)
	a := p.ends.Get().(*asyncEnd)
	a.cb, a.addr, a.msgID = cb, addr, h.MsgID
	cn.InvokeAsyncTimeout(ctx, req, timeout, a.onResponse)
}

// asyncEnd is an EndTransactionAsync awaiting its answer, pooled with its
// response callback bound once (onResponse), so that an asynchronous
// END_TRANSACTION allocates no closure.
type asyncEnd struct {
	p          *Producer
	cb         func(error)
	addr       string
	msgID      string
	onResponse func(*protocol.Command, error) // a.response, bound once
}

func (p *Producer) newAsyncEnd() any {
	a := &asyncEnd{p: p}
	a.onResponse = a.response
	return a
}

// response is the remoting callback: a transport error comes after the
// request was handed to the connection. a goes back to its pool before
// the user's callback runs.
func (a *asyncEnd) response(resp *protocol.Command, err error) {
	cb, addr, msgID := a.cb, a.addr, a.msgID
	a.cb, a.addr, a.msgID = nil, "", ""
	a.p.ends.Put(a)
	if err != nil {
		err = &sentError{addr: addr, err: err}
	}
	cb(endResult(resp, err, addr, msgID))
}

// endRequest returns the END_TRANSACTION request ending h (a pooled
// command: putCmd it once sent) and the address it goes to.
func (p *Producer) endRequest(ctx context.Context, h *TxHandle, commit bool) (string, *protocol.Command, error) {
	if p.closed.Load() {
		return "", nil, ErrClosed
	}
	addr := h.BrokerAddr
	if r, err := p.c.Route(ctx, h.Topic); err == nil {
		if a, ok := r.MasterAddr(h.BrokerName); ok {
			addr = a
		}
	}
	if addr == "" {
		return "", nil, fmt.Errorf("%w: no address for broker %q", ErrNoRoute, h.BrokerName)
	}
	group := h.ProducerGroup
	if group == "" {
		group = p.group
	}
	typ := protocol.SysFlagTransactionRollback
	if commit {
		typ = protocol.SysFlagTransactionCommit
	}
	// A pooled command, as the send path uses: its ext fields' storage is
	// reused (the request is encoded once it has been handed over).
	req := p.cmds.Get().(*protocol.Command)
	req.Code = protocol.ReqEndTransaction
	req.Flag, req.Opaque, req.Remark = 0, 0, ""
	eh := protocol.EndTransactionRequestHeader{
		Topic:                h.Topic,
		ProducerGroup:        group,
		TranStateTableOffset: h.TranStateTableOffset,
		CommitLogOffset:      h.CommitLogOffset,
		CommitOrRollback:     typ,
		FromTransactionCheck: protocol.Some(false),
		MsgID:                h.MsgID,
		TransactionID:        h.TransactionID,
		BrokerName:           h.BrokerName,
	}
	eh.Encode(req)
	return addr, req, nil
}

// endResult turns the outcome of an END_TRANSACTION to addr into
// EndTransaction's error.
func endResult(resp *protocol.Command, err error, addr, msgID string) error {
	if err != nil {
		return fmt.Errorf("client: end transaction %s: %w", msgID, err)
	}
	if err := protocol.ResponseError(resp); err != nil {
		if errors.Is(err, protocol.ErrRequestCodeNotSupported) {
			return fmt.Errorf("%w: %s: %w", ErrTxUnsupported, addr, err)
		}
		return fmt.Errorf("client: end transaction %s on %s: %w", msgID, addr, err)
	}
	return nil
}

// handleCheck answers CHECK_TRANSACTION_STATE for this producer's group.
func (p *Producer) handleCheck(ctx context.Context, addr string, req *protocol.Command) *protocol.Command {
	if p.closed.Load() {
		return nil
	}
	log := p.c.log
	var h protocol.CheckTransactionStateRequestHeader
	if err := h.Decode(req); err != nil {
		log.Warn("client: bad transaction check-back", "addr", addr, "err", err)
		return nil
	}
	m, _, err := protocol.DecodeRecord(req.Body)
	if err != nil {
		log.Warn("client: bad transaction check-back message", "addr", addr, "err", err)
		return nil
	}
	if g, _ := m.Property(protocol.PropProducerGroup); g != p.group {
		return nil // another producer's (or group's) transaction
	}
	state := p.cfg.checkListener(ctx, &m)
	if state != TxCommit && state != TxRollback {
		return nil
	}
	typ := protocol.SysFlagTransactionRollback
	if state == TxCommit {
		typ = protocol.SysFlagTransactionCommit
	}
	msgID := m.UniqKey()
	if msgID == "" {
		msgID = h.MsgID
	}
	txID := h.TransactionID
	if v, ok := m.Property(protocol.PropTransactionID); ok && v != "" {
		txID = v
	}
	end := protocol.NewRequest(protocol.ReqEndTransaction)
	eh := protocol.EndTransactionRequestHeader{
		Topic:                m.Topic,
		ProducerGroup:        p.group,
		TranStateTableOffset: h.TranStateTableOffset,
		CommitLogOffset:      h.CommitLogOffset,
		CommitOrRollback:     typ,
		FromTransactionCheck: protocol.Some(true),
		MsgID:                msgID,
		TransactionID:        txID,
		BrokerName:           h.BrokerName,
	}
	eh.Encode(end)
	if err := p.c.invokeOneway(ctx, addr, end); err != nil && ctx.Err() == nil {
		log.Warn("client: answering transaction check-back", "addr", addr, "msgId", msgID, "err", err)
	}
	return nil
}
