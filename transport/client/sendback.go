package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// Send-back: a consumer that failed a message hands it to the broker's
// retry machinery (protocol reference §7.3). CONSUMER_SEND_MSG_BACK names
// the message by commit-log offset; the broker stores a copy in
// %RETRY%<group> through the delay levels (level 0: 3 + reconsume times,
// 10 s, 30 s, 1 min, …) or, once the message came back maxReconsumeTimes
// times (or for a negative level), in %DLQ%<group>. When that request
// fails, the client sends the copy to the retry topic itself (SEND_MESSAGE
// with the reconsume counts in the header: the broker applies the same DLQ
// rule), as Java's DefaultMQPushConsumerImpl.sendMessageBack does.

// DefaultMaxReconsumeTimes is how many times a sent-back message comes
// back before the broker dead-letters it (RocketMQ's default for
// concurrent consumers, 16).
const DefaultMaxReconsumeTimes = 16

// innerProducerGroup is the producer group of the client's own retry-topic
// sends (Java MixAll.CLIENT_INNER_PRODUCER_GROUP).
const innerProducerGroup = "CLIENT_INNER_PRODUCER"

// sendBackTimeout bounds each send-back request (Java: 5 s).
const sendBackTimeout = 5 * time.Second

// SendBack hands a consumed message back to the broker for redelivery to
// the group after delayLevel (0: the broker's choice, 3 + the message's
// reconsume times; a negative level: straight to %DLQ%<group>), for
// consumers that pull (Java's DefaultMQPullConsumer.sendMessageBack). After
// WithMaxReconsumeTimes deliveries (16) the broker dead-letters it. The
// message is the one pulled (its CommitLogOffset and StoreHost name it on
// the broker). The group's consumers must subscribe %RETRY%<group>
// (RetryTopic) to receive it again; a PushConsumer does. It blocks for the
// request (and the fallback send when the broker refused it), each bounded
// by ctx and 5 s.
func (g *GroupConsumer) SendBack(ctx context.Context, m *protocol.MessageExt, delayLevel int) error {
	return g.c.sendBack(ctx, g.group, m, protocol.MessageQueue{}, delayLevel, g.cfg.maxReconsume)
}

// sendBack is the send-back of m (consumed from q; the zero queue when
// unknown: m.StoreHost names the broker) for group, with the fallback to a
// retry-topic send.
func (c *Client) sendBack(ctx context.Context, group string, m *protocol.MessageExt, q protocol.MessageQueue, delayLevel int, maxTimes int32) error {
	err := c.consumerSendBack(ctx, group, m, q, delayLevel, maxTimes)
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return err
	}
	c.log.Warn("client: send-back failed; sending to the retry topic", "group", group, "msgId", m.MsgID(), "err", err)
	if ferr := c.sendToRetry(ctx, group, m, maxTimes, 3+int(m.ReconsumeTimes)); ferr != nil {
		return fmt.Errorf("client: send back %s: %w", m.MsgID(), errors.Join(err, ferr))
	}
	return nil
}

// consumerSendBack sends CONSUMER_SEND_MSG_BACK to the master of the
// message's broker.
func (c *Client) consumerSendBack(ctx context.Context, group string, m *protocol.MessageExt, q protocol.MessageQueue, delayLevel int, maxTimes int32) error {
	addr, name, err := c.storeBroker(ctx, m, q)
	if err != nil {
		return err
	}
	req := protocol.NewRequest(protocol.ReqConsumerSendMsgBack)
	h := protocol.ConsumerSendMsgBackRequestHeader{
		Offset:            m.CommitLogOffset,
		Group:             group,
		DelayLevel:        int32(delayLevel),
		OriginMsgID:       m.MsgID(),
		OriginTopic:       m.Topic,
		UnitMode:          protocol.Some(false),
		MaxReconsumeTimes: protocol.Some(maxTimes),
		BrokerName:        name,
	}
	h.Encode(req)
	rctx, cancel := context.WithTimeout(ctx, sendBackTimeout)
	defer cancel()
	resp, err := c.invoke(rctx, addr, req)
	if err == nil {
		err = protocol.ResponseError(resp)
	}
	if err != nil {
		return fmt.Errorf("client: CONSUMER_SEND_MSG_BACK of %s to %s: %w", m.MsgID(), addr, err)
	}
	return nil
}

// storeBroker returns the master address and broker name of the broker
// that stored m: the master of q's broker when q is known (the queue m was
// pulled from), else m's store host.
func (c *Client) storeBroker(ctx context.Context, m *protocol.MessageExt, q protocol.MessageQueue) (addr, name string, err error) {
	if q.BrokerName != "" {
		if a, err := c.masterOf(ctx, q); err == nil {
			return a, q.BrokerName, nil
		}
	}
	if !m.StoreHost.IsValid() {
		return "", "", fmt.Errorf("%w: no master of %s and no store host for message %s", ErrNoRoute, q, m.MsgID())
	}
	addr = m.StoreHost.String()
	if r, err := c.Route(ctx, m.Topic); err == nil {
		for _, bn := range r.BrokerNames() {
			if a, ok := r.MasterAddr(bn); ok && a == addr {
				return addr, bn, nil
			}
		}
	}
	return addr, q.BrokerName, nil
}

// sendToRetry stores a copy of m in %RETRY%<group> with SEND_MESSAGE_V2:
// the reconsume counts in the header (reconsume times + 1 and maxTimes),
// RETRY_TOPIC and ORIGIN_MESSAGE_ID set, DELAY = delayLevel, TRAN_MSG
// removed (Java's sendMessageBackAsNormalMessage). A broker moves it to
// the DLQ when the counts say so, or when the group consumes orderly.
func (c *Client) sendToRetry(ctx context.Context, group string, m *protocol.MessageExt, maxTimes int32, delayLevel int) error {
	topic := RetryTopic(group)
	route, err := c.Route(ctx, topic)
	if err != nil {
		return fmt.Errorf("client: route of %s: %w", topic, err)
	}
	qs := route.PublishQueues()
	if len(qs) == 0 {
		return fmt.Errorf("%w: %s has no writable queue", ErrNoRoute, topic)
	}
	q := qs[rand.IntN(len(qs))]
	addr, ok := route.MasterAddr(q.BrokerName)
	if !ok {
		return fmt.Errorf("%w: broker %q of %s has no master", ErrNoRoute, q.BrokerName, topic)
	}
	origin, _ := m.Property(protocol.PropOriginMessageID)
	if origin == "" {
		origin = m.MsgID()
	}
	props := protocol.AppendPropertiesExcept(nil, m.Properties, protocol.PropOriginMessageID, protocol.PropRetryTopic,
		protocol.PropDelayLevel, protocol.PropTransactionPrepared)
	props = protocol.AppendProperty(props, protocol.PropOriginMessageID, origin)
	props = protocol.AppendProperty(props, protocol.PropRetryTopic, m.Topic)
	if delayLevel > 0 {
		props = protocol.AppendProperty(props, protocol.PropDelayLevel, strconv.Itoa(delayLevel))
	}
	body := m.Body
	if m.Compressed() {
		if body, err = m.DecompressedBody(protocol.MaxBodySize); err != nil {
			return fmt.Errorf("client: retry copy of %s: %w", m.MsgID(), err)
		}
	}
	req := protocol.NewRequest(protocol.ReqSendMessageV2)
	h := protocol.SendMessageRequestHeaderV2{
		ProducerGroup:         innerProducerGroup,
		Topic:                 topic,
		DefaultTopic:          DefaultTopic,
		DefaultTopicQueueNums: DefaultTopicQueueNums,
		QueueID:               q.QueueID,
		SysFlag:               0,
		BornTimestamp:         time.Now().UnixMilli(),
		Flag:                  m.Flag,
		Properties:            string(props),
		ReconsumeTimes:        protocol.Some(m.ReconsumeTimes + 1),
		UnitMode:              protocol.Some(false),
		MaxReconsumeTimes:     protocol.Some(maxTimes),
		BrokerName:            q.BrokerName,
	}
	h.Encode(req)
	req.Body = body
	rctx, cancel := context.WithTimeout(ctx, sendBackTimeout)
	defer cancel()
	resp, err := c.invoke(rctx, addr, req)
	if err == nil {
		switch resp.Code {
		case protocol.ResSuccess, protocol.ResFlushDiskTimeout, protocol.ResFlushSlaveTimeout, protocol.ResSlaveNotAvailable:
		default:
			err = protocol.ResponseError(resp)
		}
	}
	if err != nil {
		return fmt.Errorf("client: send %s to %s: %w", m.MsgID(), topic, err)
	}
	return nil
}
