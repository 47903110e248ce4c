package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// POP consumption (RocketMQ 5): the broker balances the queues among the
// group's consumers. Pop takes messages and makes them invisible to other
// pops for an invisible time; Ack consumes one; ChangeInvisibleTime moves
// its deadline; a message neither acked nor moved by its deadline comes
// back (through the group's pop retry topic, %RETRY%<group>_<topic>, with
// its reconsume count up). Orderly pops hand out a queue's messages only
// while none of the previous batch is unacked and still invisible.

// Limits of POP requests (Java's PopMessageProcessor).
const (
	// MaxPopMsgs bounds PopRequest.MaxMsgs.
	MaxPopMsgs = 32
	// DefaultPopInvisibleTime is the invisible time of a PopRequest that
	// sets none (Java DefaultMQPushConsumer.popInvisibleTime).
	DefaultPopInvisibleTime = time.Minute
)

// PopRequest is one POP_MESSAGE.
type PopRequest struct {
	// Queue is the queue to pop; QueueID -1 pops every queue of the
	// topic on Queue.BrokerName's broker.
	Queue protocol.MessageQueue
	// Group is the consumer group.
	Group string
	// MaxMsgs bounds the messages returned (1..MaxPopMsgs; 0 = MaxPopMsgs).
	MaxMsgs int32
	// InvisibleTime is how long the messages stay invisible to other pops
	// (DefaultPopInvisibleTime when 0).
	InvisibleTime time.Duration
	// PollTime lets the broker hold the pop this long when it finds
	// nothing (long polling); 0 answers at once.
	PollTime time.Duration
	// Selector filters the messages (all when zero).
	Selector Selector
	// Order pops orderly (RocketMQ's pop with queue lock semantics).
	Order bool
	// AttemptID names an orderly pop attempt: a retry with the same id
	// gets the same batch again.
	AttemptID string
	// FromFirst starts a group with no offset at the queue's first
	// message (ConsumeInitMode MIN) instead of its end (MAX).
	FromFirst bool
}

// PopStatus is the outcome of a Pop.
type PopStatus int8

const (
	// PopFound: Messages holds at least one message.
	PopFound PopStatus = iota
	// PopNoNewMsg: nothing to pop (after PollTime).
	PopNoNewMsg
	// PopPollingFull: the broker holds too many parked pops; try later.
	PopPollingFull
)

// PopResult is the answer to a Pop.
type PopResult struct {
	Status        PopStatus
	PopTime       int64 // ms
	InvisibleTime time.Duration
	ReviveQID     int32
	RestNum       int64 // messages left in the queues popped
	Messages      []PoppedMessage
}

// PoppedMessage is a popped message and its receipt handle.
type PoppedMessage struct {
	protocol.MessageExt
	// Handle is the receipt handle Ack and ChangeInvisibleTime send
	// (also the message's POP_CK property, as Java's client sets it).
	Handle protocol.ExtraInfo
	// Group is the group that popped it.
	Group string
}

// Pop pops messages (POP_MESSAGE) from the master of req.Queue's broker.
// Without a ctx deadline it times out after PollTime + 10 s. For a
// message from the pop retry topic, Topic is the topic popped (the broker
// rewrites it) and Handle's Retry flag names the retry topic. In orderly
// pops ReconsumeTimes is the broker's count of earlier deliveries
// (orderCountInfo).
func (c *Client) Pop(ctx context.Context, req PopRequest) (*PopResult, error) {
	if req.MaxMsgs == 0 {
		req.MaxMsgs = MaxPopMsgs
	}
	if req.MaxMsgs < 0 || req.MaxMsgs > MaxPopMsgs || req.Group == "" || req.Queue.Topic == "" {
		return nil, fmt.Errorf("%w: pop of %s by %q for %d messages", ErrInvalidOption, req.Queue, req.Group, req.MaxMsgs)
	}
	if req.InvisibleTime <= 0 {
		req.InvisibleTime = DefaultPopInvisibleTime
	}
	addr, err := c.masterOf(ctx, req.Queue)
	if err != nil {
		return nil, fmt.Errorf("client: pop %s: %w", req.Queue, err)
	}
	cmd := protocol.NewRequest(protocol.ReqPopMessage)
	h := protocol.PopMessageRequestHeader{ConsumerGroup: req.Group, Topic: req.Queue.Topic, QueueID: req.Queue.QueueID,
		MaxMsgNums: req.MaxMsgs, InvisibleTime: req.InvisibleTime.Milliseconds(), PollTime: req.PollTime.Milliseconds(),
		BornTime: time.Now().UnixMilli(), InitMode: 1, Order: protocol.Some(req.Order), AttemptID: req.AttemptID,
		BrokerName: req.Queue.BrokerName}
	if req.FromFirst {
		h.InitMode = 0
	}
	if req.Selector.Expression != "" {
		h.ExpType, h.Exp = req.Selector.Type, req.Selector.Expression
		if h.ExpType == "" {
			h.ExpType = protocol.ExpressionTypeTag
		}
	}
	h.Encode(cmd)
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, req.PollTime+pullTimeoutMargin)
		defer cancel()
	}
	resp, err := c.invoke(ctx, addr, cmd)
	if err != nil {
		return nil, fmt.Errorf("client: pop %s: %w", req.Queue, err)
	}
	res := &PopResult{}
	switch resp.Code {
	case protocol.ResSuccess:
		res.Status = PopFound
	case protocol.ResPollingTimeout, protocol.ResPullNotFound:
		res.Status = PopNoNewMsg
	case protocol.ResPollingFull:
		res.Status = PopPollingFull
	default:
		return nil, fmt.Errorf("client: pop %s from %s: %w", req.Queue, addr, protocol.ResponseError(resp))
	}
	var rh protocol.PopMessageResponseHeader
	if err := rh.Decode(resp); err != nil {
		return nil, fmt.Errorf("client: pop %s from %s: response: %w", req.Queue, addr, err)
	}
	res.PopTime, res.InvisibleTime, res.ReviveQID, res.RestNum = rh.PopTime, time.Duration(rh.InvisibleTime)*time.Millisecond, rh.ReviveQID, rh.RestNum
	if res.Status != PopFound {
		return res, nil
	}
	if err := decodePopped(res, &rh, req, resp.Body); err != nil {
		return nil, fmt.Errorf("client: pop %s from %s: %w", req.Queue, addr, err)
	}
	return res, nil
}

// decodePopped decodes a pop's messages and gives each its receipt handle
// as Java's MQClientAPIImpl.processPopResponse does: a message that came
// with POP_CK (recoded from the retry topic) keeps it; the others get one
// built from the response's start offset of their queue.
func decodePopped(res *PopResult, rh *protocol.PopMessageResponseHeader, req PopRequest, body []byte) error {
	start, err := protocol.ParsePopOffsetInfo(rh.StartOffsetInfo)
	if err != nil {
		return err
	}
	var counts protocol.PopOffsetInfo
	if req.Order {
		if counts, err = protocol.ParsePopOffsetInfo(rh.OrderCountInfo); err != nil {
			return err
		}
	}
	var derr error
	err = protocol.DecodeRecords(body, func(m *protocol.MessageExt) bool {
		pm := PoppedMessage{MessageExt: *m, Group: req.Group}
		if m.Compressed() {
			b, err := m.DecompressedBody(protocol.MaxBodySize)
			if err != nil {
				derr = fmt.Errorf("message at offset %d: %w", m.QueueOffset, err)
				return false
			}
			pm.Body = b
			pm.SysFlag &^= protocol.SysFlagCompressed | protocol.SysFlagCompressionMask
		}
		if ck, ok := m.Property(protocol.PropPopCK); ok {
			if pm.Handle, derr = protocol.ParseExtraInfo(ck); derr != nil {
				return false
			}
		} else {
			s := start[protocol.PopInfoKey(m.Topic, m.QueueID)]
			if len(s) != 1 {
				derr = fmt.Errorf("%w: no start offset of %s@%d in %q", protocol.ErrBadHeader, m.Topic, m.QueueID, rh.StartOffsetInfo)
				return false
			}
			pm.Handle = protocol.ExtraInfo{CkQueueOffset: s[0], PopTime: rh.PopTime, InvisibleTime: rh.InvisibleTime,
				ReviveQID: rh.ReviveQID, Retry: protocol.PopRetryFlag(m.Topic), BrokerName: req.Queue.BrokerName,
				QueueID: m.QueueID, MsgQueueOffset: m.QueueOffset}
		}
		if req.Order {
			if n, ok := counts[protocol.PopOrderCountKey(m.Topic, m.QueueID, m.QueueOffset)]; ok && len(n) == 1 {
				pm.ReconsumeTimes = int32(n[0])
			} else if n, ok := counts[protocol.PopInfoKey(m.Topic, m.QueueID)]; ok && len(n) == 1 {
				pm.ReconsumeTimes = int32(n[0])
			}
		}
		res.Messages = append(res.Messages, pm)
		return true
	})
	return errors.Join(err, derr)
}

// popTopic returns the topic a handle acks on: the pop retry topic when
// the message came from it.
func popTopic(m *PoppedMessage) (string, error) {
	return protocol.PopRealTopic(m.Topic, m.Group, m.Handle.Retry)
}

// Ack consumes a popped message (ACK_MESSAGE on the broker that popped
// it). An ack of a message already revived or acked succeeds and does
// nothing, as on a Java broker.
func (c *Client) Ack(ctx context.Context, m *PoppedMessage) error {
	topic, err := popTopic(m)
	if err != nil {
		return fmt.Errorf("client: ack: %w", err)
	}
	q := protocol.MessageQueue{Topic: m.Topic, BrokerName: m.Handle.BrokerName, QueueID: m.Handle.QueueID}
	req := protocol.NewRequest(protocol.ReqAckMessage)
	h := protocol.AckMessageRequestHeader{ConsumerGroup: m.Group, Topic: topic, QueueID: m.Handle.QueueID,
		ExtraInfo: m.Handle.String(), Offset: m.QueueOffset, BrokerName: m.Handle.BrokerName}
	h.Encode(req)
	_, err = c.queueRequest(ctx, "ack", q, req)
	return err
}

// ChangeInvisibleTime makes a popped message invisible for d from now
// (CHANGE_MESSAGE_INVISIBLETIME) and updates m.Handle to the new receipt
// handle, which later calls (Ack) must use.
func (c *Client) ChangeInvisibleTime(ctx context.Context, m *PoppedMessage, d time.Duration) error {
	topic, err := popTopic(m)
	if err != nil {
		return fmt.Errorf("client: change invisible time: %w", err)
	}
	q := protocol.MessageQueue{Topic: m.Topic, BrokerName: m.Handle.BrokerName, QueueID: m.Handle.QueueID}
	req := protocol.NewRequest(protocol.ReqChangeMessageInvisibleTime)
	h := protocol.ChangeInvisibleTimeRequestHeader{ConsumerGroup: m.Group, Topic: topic, QueueID: m.Handle.QueueID,
		ExtraInfo: m.Handle.String(), Offset: m.QueueOffset, InvisibleTime: d.Milliseconds(), BrokerName: m.Handle.BrokerName}
	h.Encode(req)
	resp, err := c.queueRequest(ctx, "change invisible time", q, req)
	if err != nil {
		return err
	}
	var rh protocol.ChangeInvisibleTimeResponseHeader
	if err := rh.Decode(resp); err != nil {
		return fmt.Errorf("client: change invisible time: response: %w", err)
	}
	// The new handle names the checkpoint the broker wrote for this one
	// message (Java's client builds it so).
	m.Handle.CkQueueOffset, m.Handle.PopTime, m.Handle.InvisibleTime, m.Handle.ReviveQID =
		m.QueueOffset, rh.PopTime, rh.InvisibleTime, rh.ReviveQID
	return nil
}
