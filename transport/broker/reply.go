package broker

import (
	"context"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// Request/reply (protocol §7.10): a reply sent with SEND_REPLY_MESSAGE(_V2)
// is stored in <cluster>_REPLY_TOPIC by the send path and, here, pushed to
// the requester as PUSH_REPLY_MESSAGE_TO_CLIENT over the connection of the
// producer whose clientID is the message's REPLY_TO_CLIENT. Pushes are
// synchronous calls (10 s) made by a few worker goroutines fed by a bounded
// queue, so the send path never waits for a requester.

const (
	replyQueueLen = 1024
	replyWorkers  = 4
)

// replyTask is one reply to push; it owns copies of the message's bytes.
type replyTask struct {
	m   InboundMessage
	res StoredResult
}

// replyPusher pushes stored replies to their requesters. Safe for
// concurrent use.
type replyPusher struct {
	b       *Broker
	log     *slog.Logger
	clients *clientRegistry
	timeout time.Duration
	ch      chan replyTask
	dropped atomic.Int64 // replies not pushed because the queue was full
	failed  atomic.Int64 // pushes that found no requester or failed
}

func newReplyPusher(b *Broker, clients *clientRegistry, cfg *subsystemConfig) *replyPusher {
	return &replyPusher{
		b:       b,
		log:     b.logger(),
		clients: clients,
		timeout: cfg.replyTimeout,
		ch:      make(chan replyTask, replyQueueLen),
	}
}

func isReplyCode(code int32) bool {
	return code == protocol.ReqSendReplyMessage || code == protocol.ReqSendReplyMessageV2
}

// afterStore queues a stored reply for pushing. It never blocks: when the
// queue is full the push is dropped (the reply stays stored in the reply
// topic) and counted.
func (p *replyPusher) afterStore(_ context.Context, m *InboundMessage, res StoredResult) {
	if !isReplyCode(m.Code) {
		return
	}
	t := replyTask{m: *m, res: res}
	// The request's buffers are not ours beyond this call.
	t.m.Body = slices.Clone(m.Body)
	t.m.Properties = strings.Clone(m.Properties)
	t.m.Topic = strings.Clone(m.Topic)
	t.m.ProducerGroup = strings.Clone(m.ProducerGroup)
	t.m.Conn = nil
	select {
	case p.ch <- t:
	default:
		p.dropped.Add(1)
		p.log.Warn("broker: reply push dropped: queue full", "topic", m.Topic)
	}
}

// run pushes queued replies until ctx ends; the broker runs replyWorkers
// of them.
func (p *replyPusher) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case t := <-p.ch:
			p.push(ctx, &t)
		}
	}
}

func (p *replyPusher) push(ctx context.Context, t *replyTask) {
	m := &t.m
	clientID, _ := m.Property(protocol.PropReplyToClient)
	conn := p.clients.producerByClientID(clientID)
	if conn == nil {
		p.failed.Add(1)
		p.log.Warn("broker: push reply message failed: requester not connected", "clientID", clientID, "topic", m.Topic)
		return
	}
	m.SetProperty(protocol.PropPushReplyTime, strconv.FormatInt(p.b.now().UnixMilli(), 10))
	h := protocol.ReplyMessageRequestHeader{
		ProducerGroup:         m.ProducerGroup,
		Topic:                 m.Topic,
		DefaultTopic:          topicDefault,
		DefaultTopicQueueNums: int32(p.b.cfg.topicQueueNums),
		QueueID:               m.QueueID,
		SysFlag:               m.SysFlag,
		BornTimestamp:         m.BornTimestamp,
		Flag:                  m.Flag,
		Properties:            m.Properties,
		ReconsumeTimes:        protocol.Some(m.ReconsumeTimes),
		UnitMode:              protocol.Some(false),
		BornHost:              m.BornHost.String(),
		StoreHost:             p.b.storeHost().String(),
		StoreTimestamp:        t.res.StoreTimestamp,
	}
	cmd := protocol.NewRequest(protocol.ReqPushReplyMessageToClient)
	h.Encode(cmd)
	cmd.Body = m.Body
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	resp, err := conn.Invoke(ctx, cmd)
	if err == nil {
		err = protocol.ResponseError(resp)
	}
	if err != nil {
		p.failed.Add(1)
		p.log.Warn("broker: push reply message failed", "clientID", clientID, "remote", conn.RemoteAddr().String(), "err", err)
	}
}
