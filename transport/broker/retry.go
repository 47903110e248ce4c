package broker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/runnel-dev/runnel/transport/broker/internal/store"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// Retry and dead-letter queues (protocol §7.3). A consumer that failed a
// message sends it back (CONSUMER_SEND_MSG_BACK, by commit-log offset); the
// broker stores a copy in %RETRY%<group> through the delay schedule, or in
// %DLQ%<group> once the group's retry budget is spent. A client whose
// send-back failed re-sends the message itself to %RETRY%<group>
// (SEND_MESSAGE); beforeStore applies the same DLQ rule to that path.

// versionMaxReconsumeTimes is V3_4_9: from this client version on the
// broker honours the maxReconsumeTimes header.
const versionMaxReconsumeTimes = 121

// dlqQueueNums is the queue count of a dead-letter topic (Java
// DLQ_NUMS_PER_GROUP).
const dlqQueueNums = 1

func retryTopic(group string) string { return retryPrefix + group }

func dlqTopic(group string) string { return dlqPrefix + group }

// retrier implements CONSUMER_SEND_MSG_BACK and the %RETRY% send rules.
type retrier struct {
	b     *Broker
	locks *lockManager
	sched *scheduler
}

func newRetrier(b *Broker, locks *lockManager, sched *scheduler) *retrier {
	return &retrier{b: b, locks: locks, sched: sched}
}

func (r *retrier) register(s *remoting.Server) {
	s.Handle(protocol.ReqConsumerSendMsgBack, remoting.ProcessorFunc(r.processSendBack))
}

func groupNotExist(group string) error {
	return &protocol.Error{Code: protocol.ResSubscriptionGroupNotExist, Remark: "subscription group not exist, " + group}
}

// ensureTopicRegistered is ensureTopic for the topics the broker creates
// while serving a heartbeat or a send-back (%RETRY% and %DLQ% topics):
// when it creates the topic it waits, bounded, until the name servers
// have it (awaitRegistered), as a Java broker does
// (createTopicInSendMessageBackMethod registers before it returns). A Java
// push consumer looks the route of %RETRY%<group> up in its first
// rebalance, right after its first heartbeat; a route still missing then
// is learnt only from the client's route poll, 30 s later, and retries wait
// that long. It must not run on a connection's reader goroutine.
func (b *Broker) ensureTopicRegistered(ctx context.Context, name string, queues, perm int32) (TopicConfig, error) {
	if tc, ok := b.topics.get(name); ok {
		return tc, nil
	}
	tc, err := b.ensureTopic(ctx, name, queues, perm)
	if err == nil {
		b.awaitRegistered(ctx)
	}
	return tc, err
}

// ensureDeadLetter returns the group's DLQ topic, created if missing (and
// then, with wait, registered: ensureTopicRegistered).
func (r *retrier) ensureDeadLetter(ctx context.Context, group string, wait bool) (TopicConfig, error) {
	ensure := r.b.ensureTopic
	if wait {
		ensure = r.b.ensureTopicRegistered
	}
	tc, err := ensure(ctx, dlqTopic(group), dlqQueueNums, protocol.PermRead|protocol.PermWrite)
	if err != nil {
		return TopicConfig{}, &protocol.Error{Code: protocol.ResSystemError, Remark: "topic[" + dlqTopic(group) + "] not exist: " + err.Error()}
	}
	return tc, nil
}

func randomQueue(n int32) int32 {
	if n <= 1 {
		return 0
	}
	return rand.Int32N(n)
}

func (r *retrier) processSendBack(ctx context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var h protocol.ConsumerSendMsgBackRequestHeader
	if err := h.Decode(req); err != nil {
		return nil, &protocol.Error{Code: protocol.ResSystemError, Remark: err.Error()}
	}
	if r.b.isSlave() {
		return respond(req, protocol.ResServiceNotAvailable, slaveRefusesWrites), nil
	}
	gc, ok := r.b.groupConfig(h.Group, true)
	if !ok {
		return nil, groupNotExist(h.Group)
	}
	if gc.RetryQueueNums <= 0 {
		return protocol.NewResponse(req, protocol.ResSuccess, ""), nil // retry disabled: drop
	}
	rt := retryTopic(h.Group)
	tc, err := r.b.ensureTopicRegistered(ctx, rt, gc.RetryQueueNums, protocol.PermRead|protocol.PermWrite)
	if err != nil {
		return nil, &protocol.Error{Code: protocol.ResSystemError, Remark: "topic[" + rt + "] not exist: " + err.Error()}
	}
	if !protocol.PermWritable(tc.Perm) {
		return nil, &protocol.Error{Code: protocol.ResNoPermission, Remark: "the topic[" + rt + "] sending message is forbidden"}
	}
	orig, _, err := r.b.lookupByPhysicalOffset(h.Offset)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, &protocol.Error{Code: protocol.ResSystemError, Remark: fmt.Sprintf("look message by offset failed, %d", h.Offset)}
		}
		return nil, err
	}

	m := &InboundMessage{
		Flag:                      orig.Flag,
		Body:                      orig.Body,
		Properties:                orig.Properties,
		SysFlag:                   orig.SysFlag,
		BornTimestamp:             orig.BornTimestamp,
		BornHost:                  orig.BornHost,
		ReconsumeTimes:            orig.ReconsumeTimes + 1,
		MaxReconsumeTimes:         -1,
		PreparedTransactionOffset: 0,
		Code:                      req.Code,
		ClientVersion:             req.Version,
		Conn:                      rc.Conn(),
	}
	if _, ok := orig.Property(protocol.PropRetryTopic); !ok {
		m.SetProperty(protocol.PropRetryTopic, orig.Topic)
	}
	// Java's consumerSendMsgBack clears waitStoreMsgOK on the copy it
	// stores (retry or dead letter): consumers see WAIT=false there.
	m.SetProperty(protocol.PropWaitStoreMsgOK, "false")
	if v, ok := orig.Property(protocol.PropOriginMessageID); !ok || v == "" {
		m.SetProperty(protocol.PropOriginMessageID, orig.OffsetMsgID())
	}

	maxTimes := gc.RetryMaxTimes
	if h.MaxReconsumeTimes.Set && req.Version >= versionMaxReconsumeTimes {
		maxTimes = h.MaxReconsumeTimes.V
	}
	delayLevel := h.DelayLevel
	if orig.ReconsumeTimes >= maxTimes || delayLevel < 0 {
		dlq, err := r.ensureDeadLetter(ctx, h.Group, true)
		if err != nil {
			return nil, err
		}
		if !protocol.PermWritable(dlq.Perm) {
			return nil, &protocol.Error{Code: protocol.ResNoPermission, Remark: "the topic[" + dlq.TopicName + "] sending message is forbidden"}
		}
		m.DeleteProperties(protocol.PropDelayLevel)
		m.Topic, m.QueueID = dlq.TopicName, randomQueue(dlqQueueNums)
	} else {
		if delayLevel == 0 {
			delayLevel = 3 + orig.ReconsumeTimes
		}
		m.Topic, m.QueueID = rt, randomQueue(queueCount(tc))
		r.sched.toLevel(m, int(delayLevel))
	}
	if _, err := r.b.storeInternal(ctx, m); err != nil {
		var pe *protocol.Error
		if errors.As(err, &pe) {
			return nil, &protocol.Error{Code: protocol.ResSystemError, Remark: pe.Remark}
		}
		return nil, err
	}
	return protocol.NewResponse(req, protocol.ResSuccess, ""), nil
}

// beforeStore applies the %RETRY% send rules (Java handleRetryAndDLQ) to a
// message of the send path: the group must exist (26 otherwise); a message
// whose reconsumeTimes exceeds the group's (or the request's) maximum, or
// whose group consumes orderly (holds queue locks), goes to the DLQ.
func (r *retrier) beforeStore(ctx context.Context, m *InboundMessage) error {
	group, ok := strings.CutPrefix(m.Topic, retryPrefix)
	if !ok {
		return nil
	}
	gc, ok := r.b.groupConfig(group, true)
	if !ok {
		return groupNotExist(group)
	}
	maxTimes := gc.RetryMaxTimes
	if m.MaxReconsumeTimes >= 0 && m.ClientVersion >= versionMaxReconsumeTimes {
		maxTimes = m.MaxReconsumeTimes
	}
	if m.ReconsumeTimes <= maxTimes && !r.locks.groupHoldsLocks(group) {
		return nil
	}
	dlq, err := r.ensureDeadLetter(ctx, group, false)
	if err != nil {
		return err
	}
	if !protocol.PermWritable(dlq.Perm) {
		return &protocol.Error{Code: protocol.ResNoPermission, Remark: "the topic[" + dlq.TopicName + "] sending message is forbidden"}
	}
	m.SetProperty(protocol.PropDelayLevel, "-1")
	m.Topic, m.QueueID, m.DelayLevel = dlq.TopicName, randomQueue(dlqQueueNums), 0
	return nil
}
