package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// DefaultPullMaxMsgs is PullRequest.MaxMsgs when zero.
const DefaultPullMaxMsgs = 32

// pullTimeoutMargin is added to the suspend time for a pull's client-side
// timeout when ctx has no deadline (RocketMQ: 30 s for a 20 s suspend).
const pullTimeoutMargin = 10 * time.Second

// PullRequest asks for messages of one queue from an offset.
type PullRequest struct {
	// Queue to read.
	Queue protocol.MessageQueue
	// Offset is the logical queue offset to read from.
	Offset int64
	// MaxMsgs bounds the messages returned (DefaultPullMaxMsgs when 0).
	MaxMsgs int32
	// Suspend lets the broker hold the pull this long when no message is
	// there yet (long polling); 0 answers at once.
	Suspend time.Duration
	// Group is the consumer group pulling (brokers need one; it is created
	// on first use by brokers that auto-create groups).
	Group string
	// Expression filters messages: a TAG expression such as "a || b" ("" or
	// "*" = all) or, with ExpressionType SQL92, an SQL92 expression.
	Expression string
	// ExpressionType is protocol.ExpressionTypeTag (default) or
	// protocol.ExpressionTypeSQL92.
	ExpressionType string
	// CommitOffset, when > 0, is stored by the broker as the group's
	// consumed offset of the queue (informational; runnel keeps its own).
	CommitOffset int64
}

// PullStatus is the outcome of a pull.
type PullStatus int

// Pull outcomes.
const (
	// PullFound: Messages holds at least one message.
	PullFound PullStatus = iota
	// PullNoNewMsg: nothing at Offset yet (PULL_NOT_FOUND), after the
	// suspend time when long polling.
	PullNoNewMsg
	// PullNoMatchedMsg: messages existed but the filter dropped them all
	// (PULL_RETRY_IMMEDIATELY); continue from NextBeginOffset.
	PullNoMatchedMsg
	// PullOffsetIllegal: Offset is outside the queue (PULL_OFFSET_MOVED);
	// NextBeginOffset is where reading can resume.
	PullOffsetIllegal
)

// String returns the RocketMQ name of s.
func (s PullStatus) String() string {
	switch s {
	case PullFound:
		return "FOUND"
	case PullNoNewMsg:
		return "NO_NEW_MSG"
	case PullNoMatchedMsg:
		return "NO_MATCHED_MSG"
	case PullOffsetIllegal:
		return "OFFSET_ILLEGAL"
	}
	return fmt.Sprintf("PullStatus(%d)", int(s))
}

// PullResult is a pull's answer.
//
// Messages ALIAS the response buffer: bodies, topics and properties share
// one allocation with it, so keeping one message keeps the whole response
// alive, and the buffer must not be modified. Clone what you keep long.
// Compressed bodies are decompressed (into their own allocation) and their
// SysFlag compressed bit cleared. A record holding a whole batch (RocketMQ
// 5 topics with queue.type=BatchCQ store a Java producer's batch as one
// inner-batch record) is unwrapped into its messages, at consecutive queue
// offsets, as Java's client does.
type PullResult struct {
	Status          PullStatus
	NextBeginOffset int64
	MinOffset       int64
	MaxOffset       int64
	// SuggestBrokerID is the broker id the broker suggested for the next
	// pull of this queue (0 = master); the Client follows it.
	SuggestBrokerID int64
	// BrokerAddr and BrokerID are the broker that answered (a slave's
	// when the master suggested one, or was unreachable).
	BrokerAddr string
	BrokerID   int64
	Messages   []protocol.MessageExt
}

// Pull reads messages of one queue from req.Offset. It blocks for the
// round trip, plus up to req.Suspend when the broker long-polls; without a
// ctx deadline, the pull times out after Suspend + 10 s. The broker is the
// one the previous pull of the queue suggested (the master at first).
// NOT_FOUND, RETRY_IMMEDIATELY and OFFSET_MOVED are outcomes (Status), not
// errors; other broker replies are *protocol.Error errors.
//
// TAG expressions are also applied client-side, as RocketMQ clients do,
// since brokers filter by tag hash only.
func (c *Client) Pull(ctx context.Context, req PullRequest) (*PullResult, error) {
	if len(c.cfg.hooks.pull) > 0 {
		return c.pullHooked(ctx, req) // hooks.go
	}
	return c.pull(ctx, req)
}

func (c *Client) pull(ctx context.Context, req PullRequest) (*PullResult, error) {
	if err := validateName("consumer group", req.Group, MaxGroupLength); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	if req.MaxMsgs <= 0 {
		req.MaxMsgs = DefaultPullMaxMsgs
	}
	expr, typ := req.Expression, req.ExpressionType
	if typ == "" {
		typ = protocol.ExpressionTypeTag
	}
	if expr == "" {
		expr = protocol.TagExpressionAll
	}
	route, err := c.Route(ctx, req.Queue.Topic)
	if err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, req.Suspend+pullTimeoutMargin)
		defer cancel()
	}
	addr, brokerID, fallback, err := c.pullBroker(route, req.Queue, false)
	if err != nil {
		return nil, err
	}
	resp, err := c.invoke(ctx, addr, c.pullCommand(&req, expr, typ, brokerID))
	if err != nil && brokerID == protocol.MasterID && isTransport(err) && ctx.Err() == nil {
		// The master is unreachable: its slave serves the pull (the
		// same queue offsets), as RocketMQ clients read from a slave
		// once the master is gone.
		if saddr, sid, _, serr := c.pullBroker(route, req.Queue, true); serr == nil && sid != protocol.MasterID {
			c.log.Debug("client: master unreachable; pulling from its slave", "queue", req.Queue, "master", addr, "slave", saddr, "err", err)
			addr, brokerID, fallback = saddr, sid, true
			resp, err = c.invoke(ctx, addr, c.pullCommand(&req, expr, typ, brokerID))
		}
	}
	if err != nil {
		return nil, fmt.Errorf("client: pull %s: %w", req.Queue, err)
	}
	res := &PullResult{BrokerAddr: addr, BrokerID: brokerID}
	switch resp.Code {
	case protocol.ResSuccess:
		res.Status = PullFound
	case protocol.ResPullNotFound:
		res.Status = PullNoNewMsg
	case protocol.ResPullRetryImmediately:
		res.Status = PullNoMatchedMsg
	case protocol.ResPullOffsetMoved:
		res.Status = PullOffsetIllegal
	default:
		return nil, fmt.Errorf("client: pull %s from %s: %w", req.Queue, addr, protocol.ResponseError(resp))
	}
	var rh protocol.PullMessageResponseHeader
	if err := rh.Decode(resp); err != nil {
		return nil, fmt.Errorf("client: pull %s from %s: response: %w", req.Queue, addr, err)
	}
	res.NextBeginOffset, res.MinOffset, res.MaxOffset, res.SuggestBrokerID = rh.NextBeginOffset, rh.MinOffset, rh.MaxOffset, rh.SuggestWhichBrokerID
	c.setSuggestedBroker(req.Queue, rh.SuggestWhichBrokerID)
	if fallback && res.Status != PullFound && res.NextBeginOffset == req.Offset {
		// A slave that still hears from the master this client cannot
		// reach sends it back to the master at once (RETRY_IMMEDIATELY):
		// wait here, as a long poll would, rather than spin between the two.
		res.Status = PullNoNewMsg
		if err := waitCtx(ctx, min(max(req.Suspend, 100*time.Millisecond), time.Second)); err != nil {
			return nil, fmt.Errorf("client: pull %s: %w", req.Queue, err)
		}
	}
	if res.Status != PullFound {
		return res, nil
	}
	return c.decodePulled(res, &req, resp, expr, typ, addr)
}

// pullBroker chooses the broker a pull of q goes to, as RocketMQ clients
// do (findBrokerAddressInSubscribe): the one the last pull suggested (or
// the next id when it is gone), else the master, else a slave; a master
// whose last dial failed is passed over for a slave until its backoff
// ends. avoidMaster asks for a slave. fallback tells a slave chosen because
// the master is not there.
func (c *Client) pullBroker(route *TopicRoute, q protocol.MessageQueue, avoidMaster bool) (addr string, id int64, fallback bool, err error) {
	name := q.BrokerName
	if s := c.suggestedBroker(q); s != protocol.MasterID && !avoidMaster {
		if a, ok := route.BrokerAddr(name, s); ok {
			return a, s, false, nil
		}
		if a, ok := route.BrokerAddr(name, s+1); ok {
			return a, s + 1, false, nil
		}
	}
	master, hasMaster := route.MasterAddr(name)
	if hasMaster && !avoidMaster && !c.addrDown(master) {
		return master, protocol.MasterID, false, nil
	}
	if a, sid, ok := route.SlaveAddr(name); ok {
		return a, sid, true, nil
	}
	if hasMaster {
		return master, protocol.MasterID, false, nil
	}
	return "", 0, false, fmt.Errorf("%w: broker %q of %s has no address", ErrNoRoute, name, q)
}

// waitCtx waits d or until ctx ends.
func waitCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// pullCommand builds the PULL_MESSAGE request of req for broker id (the
// commit-offset flag only to a master, as RocketMQ clients do).
func (c *Client) pullCommand(req *PullRequest, expr, typ string, brokerID int64) *protocol.Command {
	sysFlag := protocol.PullFlagSubscription
	if req.Suspend > 0 {
		sysFlag |= protocol.PullFlagSuspend
	}
	if req.CommitOffset > 0 && brokerID == protocol.MasterID {
		sysFlag |= protocol.PullFlagCommitOffset
	}
	cmd := protocol.NewRequest(protocol.ReqPullMessage)
	h := protocol.PullMessageRequestHeader{
		ConsumerGroup:        req.Group,
		Topic:                req.Queue.Topic,
		QueueID:              req.Queue.QueueID,
		QueueOffset:          req.Offset,
		MaxMsgNums:           req.MaxMsgs,
		SysFlag:              sysFlag,
		CommitOffset:         req.CommitOffset,
		SuspendTimeoutMillis: req.Suspend.Milliseconds(),
		Subscription:         expr,
		SubVersion:           0,
		ExpressionType:       typ,
		BrokerName:           req.Queue.BrokerName,
	}
	h.Encode(cmd)
	return cmd
}

// decodePulled decodes the messages of a FOUND response into res.
func (c *Client) decodePulled(res *PullResult, req *PullRequest, resp *protocol.Command, expr, typ, addr string) (*PullResult, error) {
	var filter protocol.TagFilter
	tagFilter := typ == protocol.ExpressionTypeTag
	if tagFilter {
		filter = protocol.ParseTagExpression(expr)
		tagFilter = !filter.All
	}
	res.Messages = make([]protocol.MessageExt, 0, min(int(req.MaxMsgs), DefaultPullMaxMsgs))
	var derr error
	err := protocol.DecodeRecords(resp.Body, func(m *protocol.MessageExt) bool {
		inner := m.SysFlag&innerBatch == innerBatch
		if !inner && tagFilter && !filter.Match(m.Tags()) {
			return true
		}
		if m.Compressed() {
			body, err := m.DecompressedBody(protocol.MaxBodySize)
			if err != nil {
				derr = fmt.Errorf("client: pull %s: message at offset %d: %w", req.Queue, m.QueueOffset, err)
				return false
			}
			m.Body = body
			m.SysFlag &^= protocol.SysFlagCompressed | protocol.SysFlagCompressionMask
		}
		if inner {
			if err := unwrapInnerBatch(m, func(im *protocol.MessageExt) {
				if !tagFilter || filter.Match(im.Tags()) {
					res.Messages = append(res.Messages, *im)
				}
			}); err != nil {
				derr = fmt.Errorf("client: pull %s: inner batch at offset %d: %w", req.Queue, m.QueueOffset, err)
				return false
			}
			return true
		}
		res.Messages = append(res.Messages, *m)
		return true
	})
	if err == nil {
		err = derr
	}
	if err != nil {
		return nil, fmt.Errorf("client: pull %s from %s: %w", req.Queue, addr, err)
	}
	if len(res.Messages) == 0 {
		res.Status = PullNoMatchedMsg
	}
	return res, nil
}

// innerBatch marks a record that holds a whole batch (RocketMQ 5 topics
// with queue.type=BatchCQ store a producer's batch so): both flags set.
const innerBatch = protocol.SysFlagInnerBatch | protocol.SysFlagNeedUnwrap

// unwrapInnerBatch calls fn with each message of the inner-batch record m,
// as Java's client unwraps them (PullAPIWrapper, MessageDecoder.decodeMessage):
// the batch item's flag, body and properties, at queue offset m.QueueOffset+i,
// everything else (topic, queue, hosts, times, commit log offset) m's. The
// messages alias m's body; SysFlagNeedUnwrap is cleared in them.
func unwrapInnerBatch(m *protocol.MessageExt, fn func(*protocol.MessageExt)) error {
	i := int64(0)
	return protocol.DecodeBatch(m.Body, 0, func(flag int32, body []byte, props string) error {
		im := *m
		im.StoreSize, im.BodyCRC = 0, 0
		im.QueueOffset = m.QueueOffset + i
		im.Flag, im.Body, im.Properties = flag, body, props
		im.SysFlag &^= protocol.SysFlagNeedUnwrap
		i++
		fn(&im)
		return nil
	})
}

// suggestedBroker returns the broker id the last pull of q suggested.
func (c *Client) suggestedBroker(q protocol.MessageQueue) int64 {
	if v, ok := c.pullFrom.Load(q); ok {
		return v.(int64)
	}
	return protocol.MasterID
}

func (c *Client) setSuggestedBroker(q protocol.MessageQueue, id int64) {
	if id == protocol.MasterID {
		if _, ok := c.pullFrom.Load(q); ok {
			c.pullFrom.Delete(q)
		}
		return
	}
	c.pullFrom.Store(q, id)
}

// queueRequest sends a request about q to its master and returns the
// successful response. When the route has no master for q's broker, or the
// master cannot be reached, the request goes to its slave: a slave answers
// offsets as its master does (it has the same queues), and keeps consumer
// offsets committed to it, as RocketMQ clients commit them
// (findBrokerAddressInSubscribe, onlyThisBroker false).
func (c *Client) queueRequest(ctx context.Context, what string, q protocol.MessageQueue, req *protocol.Command) (*protocol.Command, error) {
	r, err := c.Route(ctx, q.Topic)
	if err != nil {
		return nil, err
	}
	master, hasMaster := r.MasterAddr(q.BrokerName)
	slave, _, hasSlave := r.SlaveAddr(q.BrokerName)
	addr := master
	switch {
	case !hasMaster && !hasSlave:
		return nil, fmt.Errorf("%w: broker %q of %s has no master", ErrNoRoute, q.BrokerName, q)
	case !hasMaster || (hasSlave && c.addrDown(master)):
		addr = slave
	}
	resp, err := c.invoke(ctx, addr, req)
	if err != nil && addr == master && hasSlave && isTransport(err) && ctx.Err() == nil {
		addr = slave
		resp, err = c.invoke(ctx, addr, req)
	}
	if err == nil {
		err = protocol.ResponseError(resp)
	}
	if err != nil {
		return nil, fmt.Errorf("client: %s of %s: %w", what, q, err)
	}
	return resp, nil
}

// MinOffset returns the smallest offset still readable in q
// (GET_MIN_OFFSET).
func (c *Client) MinOffset(ctx context.Context, q protocol.MessageQueue) (int64, error) {
	req := protocol.NewRequest(protocol.ReqGetMinOffset)
	h := protocol.GetMinOffsetRequestHeader{Topic: q.Topic, QueueID: q.QueueID, BrokerName: q.BrokerName}
	h.Encode(req)
	resp, err := c.queueRequest(ctx, "min offset", q, req)
	if err != nil {
		return 0, err
	}
	var rh protocol.GetMinOffsetResponseHeader
	if err := rh.Decode(resp); err != nil {
		return 0, fmt.Errorf("client: min offset of %s: %w", q, err)
	}
	return rh.Offset, nil
}

// MaxOffset returns the offset the next message of q will get
// (GET_MAX_OFFSET).
func (c *Client) MaxOffset(ctx context.Context, q protocol.MessageQueue) (int64, error) {
	req := protocol.NewRequest(protocol.ReqGetMaxOffset)
	h := protocol.GetMaxOffsetRequestHeader{Topic: q.Topic, QueueID: q.QueueID, BrokerName: q.BrokerName}
	h.Encode(req)
	resp, err := c.queueRequest(ctx, "max offset", q, req)
	if err != nil {
		return 0, err
	}
	var rh protocol.GetMaxOffsetResponseHeader
	if err := rh.Decode(resp); err != nil {
		return 0, fmt.Errorf("client: max offset of %s: %w", q, err)
	}
	return rh.Offset, nil
}

// SearchOffset returns the offset of the first message of q stored at or
// after t (SEARCH_OFFSET_BY_TIMESTAMP, lower boundary).
func (c *Client) SearchOffset(ctx context.Context, q protocol.MessageQueue, t time.Time) (int64, error) {
	req := protocol.NewRequest(protocol.ReqSearchOffsetByTimestamp)
	h := protocol.SearchOffsetRequestHeader{Topic: q.Topic, QueueID: q.QueueID, Timestamp: t.UnixMilli(), BrokerName: q.BrokerName}
	h.Encode(req)
	resp, err := c.queueRequest(ctx, "search offset", q, req)
	if err != nil {
		return 0, err
	}
	var rh protocol.SearchOffsetResponseHeader
	if err := rh.Decode(resp); err != nil {
		return 0, fmt.Errorf("client: search offset of %s: %w", q, err)
	}
	return rh.Offset, nil
}

// QueryConsumerOffset returns the offset group committed for q
// (QUERY_CONSUMER_OFFSET); an error wrapping ErrNoOffset (and
// protocol.ErrQueryNotFound) when it has none. Apache RocketMQ 4.x brokers
// ignore the request's setZeroIfNotFound=false and answer 0 instead while
// the queue's first message is still in memory.
func (c *Client) QueryConsumerOffset(ctx context.Context, group string, q protocol.MessageQueue) (int64, error) {
	req := protocol.NewRequest(protocol.ReqQueryConsumerOffset)
	h := protocol.QueryConsumerOffsetRequestHeader{ConsumerGroup: group, Topic: q.Topic, QueueID: q.QueueID,
		SetZeroIfNotFound: protocol.Some(false), BrokerName: q.BrokerName}
	h.Encode(req)
	resp, err := c.queueRequest(ctx, "consumer offset", q, req)
	if err != nil {
		if errors.Is(err, protocol.ErrQueryNotFound) {
			return -1, fmt.Errorf("%w: group %q, %s", ErrNoOffset, group, q)
		}
		return 0, err
	}
	var rh protocol.QueryConsumerOffsetResponseHeader
	if err := rh.Decode(resp); err != nil {
		return 0, fmt.Errorf("client: consumer offset of %s: %w", q, err)
	}
	return rh.Offset, nil
}

// CommitOffset stores offset as group's consumed offset of q on its broker
// (UPDATE_CONSUMER_OFFSET) and waits for the broker's answer. Apache
// RocketMQ 5 brokers refuse it for a group they do not know yet
// (SUBSCRIPTION_GROUP_NOT_EXIST): a group exists once a heartbeat or a pull
// of it arrived (with autoCreateSubscriptionGroup, the default) or an admin
// created it.
func (c *Client) CommitOffset(ctx context.Context, group string, q protocol.MessageQueue, offset int64) error {
	req := protocol.NewRequest(protocol.ReqUpdateConsumerOffset)
	h := protocol.UpdateConsumerOffsetRequestHeader{ConsumerGroup: group, Topic: q.Topic, QueueID: q.QueueID,
		CommitOffset: offset, BrokerName: q.BrokerName}
	h.Encode(req)
	_, err := c.queueRequest(ctx, "commit offset", q, req)
	return err
}
