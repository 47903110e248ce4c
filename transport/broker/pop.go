package broker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// POP consumption (RocketMQ 5.x; protocol reference §3.2 "POP family"):
// the broker, not the client, balances the queues. POP_MESSAGE takes up to
// 32 messages of a queue (or of every queue, queueId -1) and makes them
// invisible to other pops for invisibleTime; ACK_MESSAGE (BATCH_ACK_MESSAGE)
// consumes them; CHANGE_MESSAGE_INVISIBLETIME moves their deadline; a
// message not acked by its deadline is revived: a copy, its reconsume count
// up, goes to the group's pop retry topic (%RETRY%<group>_<topic>), which
// pops read too (20 % of the time first, else when the topic had too few).
// Orderly pops (order=true) hand out a queue's messages only while none of
// the previous batch is unacked and still invisible; they are handed out
// again, in order, with their counts (orderCountInfo), once invisible time
// passed.
//
// Bookkeeping: a pop's checkpoint (group, topic, queue, start offset, pop
// time, invisible time, the offsets handed out and a bit per ack) is kept
// in the store's meta space, written (fsync) before the group's offset
// moves past the messages, updated on acks, and deleted once every message
// was acked or revived; revived copies are stored before the checkpoint is
// deleted. A crash or kill -9 at any point therefore loses no message (it
// may revive one twice). Checkpoints are loaded at the first POP request
// after a start. Java keeps the same records as CK/ACK messages in
// rmq_sys_REVIVE_LOG_<cluster> and matches them by timer; runnel keeps them
// as records, with the same effect on the wire. Orderly state lives in
// memory (Java persists it periodically): after a restart an orderly queue
// is handed out again from the group's committed offset.

// popConfig holds the POP options (defaults resolved by newPopService).
type popConfig struct {
	reviveInterval   time.Duration // revive scan period (Java reviveInterval, 1 s)
	reviveQueueNum   int32         // revive queues handed out round robin (8)
	retryProbability int           // % of pops that read the retry topic first (20)
	maxPolling       int           // parked pops, all keys (maxPopPollingSize, 100000)
	maxPollingPerKey int           // parked pops per topic/group/queue (popPollingSize, 1024)
	defaultMode      string        // QUERY_ASSIGNMENT mode without a SET_MESSAGE_REQUEST_MODE (PULL)
	defaultShare     int32         // its popShareQueueNum (-1: every client pops every queue)
	defaultModeSet   bool
}

// WithPopReviveInterval sets how often un-acked POP messages whose
// invisible time passed are looked for (Java reviveInterval, 1 s).
func WithPopReviveInterval(d time.Duration) Option {
	return optionFunc(func(c *config) { c.pop.reviveInterval = d })
}

// WithDefaultMessageRequestMode sets the consume mode QUERY_ASSIGNMENT
// hands out for groups no SET_MESSAGE_REQUEST_MODE configured (Java's
// defaultMessageRequestMode, protocol.RequestModePull; RequestModePop makes
// 5.x Java push consumers with clientRebalance=false pop) and its
// popShareQueueNum (Java defaultPopShareQueueNum, -1).
func WithDefaultMessageRequestMode(mode string, popShareQueueNum int) Option {
	return optionFunc(func(c *config) {
		c.pop.defaultMode, c.pop.defaultShare, c.pop.defaultModeSet = mode, int32(popShareQueueNum), true
	})
}

func (c *popConfig) resolve() {
	if c.reviveInterval <= 0 {
		c.reviveInterval = time.Second
	}
	if c.reviveQueueNum <= 0 {
		c.reviveQueueNum = 8
	}
	if c.retryProbability == 0 {
		c.retryProbability = 20
	}
	if c.maxPolling <= 0 {
		c.maxPolling = 100000
	}
	if c.maxPollingPerKey <= 0 {
		c.maxPollingPerKey = 1024
	}
	if !c.defaultModeSet {
		c.defaultMode, c.defaultShare = protocol.RequestModePull, -1
	}
}

// Limits of POP requests (Java's).
const (
	popMaxMsgs      = 32
	popRetryQueues  = 1 // queues of a pop retry topic (PopAckConstants.retryQueueNum)
	popInitModeMin  = 0 // ConsumeInitMode.MIN
	popLockAttempts = 3
)

// popService serves the POP family. Its state is guarded by mu; pops of
// one group's queue are serialised by a try-lock per queue (a pop that
// finds the queue busy skips it, as Java's QueueLockManager makes it do).
// Lock order: queue lock, then mu, then the waiters' mu.
type popService struct {
	b       *Broker
	cfg     popConfig
	clients *clientRegistry // consumer ids for QUERY_ASSIGNMENT

	ckNumber atomic.Int64
	qlocks   sync.Map // lock key → *sync.Mutex
	waiters  *popWaiters

	mu struct {
		sync.Mutex
		loaded  bool
		cks     map[ckID]*popCK
		due     ckHeap
		order   map[orderKey]*orderInfo
		retryOf map[string]topicGroup // pop retry topic → its topic and group
		modes   map[topicGroup]protocol.SetMessageRequestModeRequestBody
	}
}

type topicGroup struct{ topic, group string }

func newPopService(b *Broker, cfg popConfig) *popService {
	cfg.resolve()
	p := &popService{b: b, cfg: cfg}
	p.waiters = newPopWaiters(p)
	p.mu.cks = make(map[ckID]*popCK)
	p.mu.order = make(map[orderKey]*orderInfo)
	p.mu.retryOf = make(map[string]topicGroup)
	p.mu.modes = make(map[topicGroup]protocol.SetMessageRequestModeRequestBody)
	return p
}

func (p *popService) register(s *remoting.Server) {
	s.Handle(protocol.ReqPopMessage, remoting.ProcessorFunc(p.processPop))
	s.Handle(protocol.ReqAckMessage, remoting.ProcessorFunc(p.processAck))
	s.Handle(protocol.ReqBatchAckMessage, remoting.ProcessorFunc(p.processBatchAck))
	s.Handle(protocol.ReqChangeMessageInvisibleTime, remoting.ProcessorFunc(p.processChangeInvisible))
	s.Handle(protocol.ReqNotification, remoting.ProcessorFunc(p.processNotification))
	s.Handle(protocol.ReqPollingInfo, remoting.ProcessorFunc(p.processPollingInfo))
	s.Handle(protocol.ReqQueryAssignment, remoting.ProcessorFunc(p.processQueryAssignment))
	s.Handle(protocol.ReqSetMessageRequestMode, remoting.ProcessorFunc(p.processSetRequestMode))
}

func (p *popService) nowMS() int64 { return p.b.now().UnixMilli() }

// ---- POP_MESSAGE ----

// popRequest is one POP_MESSAGE (or NOTIFICATION) being served; when
// parked its fields below the line are guarded by the waiters' mu.
type popRequest struct {
	rc       *remoting.RequestCtx
	h        protocol.PopMessageRequestHeader
	notify   bool // a NOTIFICATION: answers whether a pop would find messages
	filter   msgFilter
	deadline time.Time // bornTime + pollTime, real time

	index int // in the waiters' deadline heap, -1 when not in it
}

func (p *popService) processPop(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	pr := &popRequest{rc: rc, index: -1}
	if err := pr.h.Decode(req); err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	h := &pr.h
	nowReal := time.Now().UnixMilli()
	if h.BornTime == 0 {
		h.BornTime = nowReal
	}
	if nowReal-h.BornTime-h.PollTime > h.InvisibleTime {
		return respond(req, protocol.ResPollingTimeout, "the broker["+p.b.hostStr+"] pop message is timeout too much"), nil
	}
	if h.MaxMsgNums > popMaxMsgs {
		return respond(req, protocol.ResInvalidParameter, "the broker["+p.b.hostStr+"] pop message's num is greater than 32"), nil
	}
	if resp := p.checkTopicGroup(req, h.Topic, h.QueueID, h.ConsumerGroup); resp != nil {
		return resp, nil
	}
	if h.Exp != "" {
		if isTagType(h.ExpType) {
			pr.filter = msgFilter{tag: newTagFilter(protocol.ParseTagExpression(h.Exp).Tags)}
		} else {
			x, err := p.b.filters.compile(h.ExpType, h.Exp)
			if err != nil {
				return respond(req, protocol.ResSubscriptionParseFailed, "parse the consumer's subscription failed"), nil
			}
			pr.filter = msgFilter{sql: x}
		}
	} else {
		pr.filter = matchAll
	}
	if err := p.ensureLoaded(); err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	pr.deadline = time.UnixMilli(h.BornTime + h.PollTime)
	p.serve(pr)
	return nil, nil // answered (or parked) by serve
}

// checkTopicGroup applies Java's checks of a POP (and NOTIFICATION): the
// topic exists and is readable, the queue id is below its read queues, the
// group exists (or is auto-created) and may consume.
func (p *popService) checkTopicGroup(req *protocol.Command, topic string, queue int32, group string) *protocol.Command {
	tc, ok := p.b.topics.get(topic)
	if !ok {
		return respond(req, protocol.ResTopicNotExist, "topic["+topic+"] not exist, apply first please!")
	}
	if !protocol.PermReadable(tc.Perm) {
		return respond(req, protocol.ResNoPermission, "the topic["+topic+"] peeking message is forbidden")
	}
	if queue >= tc.ReadQueueNums {
		return respond(req, protocol.ResInvalidParameter, fmt.Sprintf("queueId[%d] is illegal, topic:[%s] topicConfig.readQueueNums:[%d]",
			queue, topic, tc.ReadQueueNums))
	}
	gc, ok := p.b.groupConfig(group, true)
	if !ok {
		return respond(req, protocol.ResSubscriptionGroupNotExist, "subscription group ["+group+"] does not exist")
	}
	if !gc.ConsumeEnable {
		return respond(req, protocol.ResNoPermission, "subscription group no permission, "+group)
	}
	return nil
}

// serve pops for pr and answers, or parks it when nothing was found and
// its poll time has not passed (re-parking on a later wake-up too, as a
// Java broker re-processes a woken pop in full).
func (p *popService) serve(pr *popRequest) {
	if pr.notify {
		p.serveNotification(pr)
		return
	}
	res := p.pop(pr)
	if res.count > 0 {
		p.answerPop(pr, protocol.ResSuccess, "FOUND", res)
		return
	}
	if pr.h.PollTime > 0 && time.Now().Before(pr.deadline) {
		switch p.waiters.park(pr) {
		case parked:
			// A message stored between the pop and the registration woke
			// nobody: look once more.
			if p.hasMessage(&pr.h) {
				p.waiters.wake(pr.h.Topic, pr.h.ConsumerGroup, -2)
			}
			return
		case parkFull:
			p.answerPop(pr, protocol.ResPollingFull, "NO_MESSAGE_IN_QUEUE", res)
			return
		}
	}
	p.answerPop(pr, protocol.ResPollingTimeout, "NO_MESSAGE_IN_QUEUE", res)
}

// popResult is what one pop found.
type popResult struct {
	popTime   int64
	reviveQid int32
	restNum   int64
	count     int
	body      []byte
	startInfo []byte
	msgInfo   []byte
	orderInfo []byte
}

func (p *popService) answerPop(pr *popRequest, code int32, remark string, res popResult) {
	resp := protocol.NewResponse(pr.rc.Request(), code, remark)
	rh := protocol.PopMessageResponseHeader{
		PopTime:         res.popTime,
		InvisibleTime:   pr.h.InvisibleTime,
		ReviveQID:       res.reviveQid,
		RestNum:         res.restNum,
		StartOffsetInfo: string(res.startInfo),
		MsgOffsetInfo:   string(res.msgInfo),
	}
	if pr.h.Order.V && len(res.orderInfo) > 0 {
		rh.OrderCountInfo = string(res.orderInfo)
	}
	rh.Encode(resp)
	if code == protocol.ResSuccess {
		resp.Body = res.body
		p.b.stats.pulledMsgs.Add(int64(res.count)) // stats.go
	}
	_ = pr.rc.Respond(resp) // an error means the connection is gone
}

// pop takes the messages of one POP request (Java
// PopMessageProcessor.processRequest's reading part).
func (p *popService) pop(pr *popRequest) popResult {
	h := &pr.h
	order := h.Order.V
	res := popResult{popTime: p.nowMS()}
	if order {
		res.reviveQid = protocol.PopOrderReviveQueue
	} else {
		res.reviveQid = int32(uint64(p.ckNumber.Add(1)-1) % uint64(p.cfg.reviveQueueNum))
	}
	randomQ := rand.IntN(100)
	needRetry := randomQ < p.cfg.retryProbability
	retryTopic := protocol.PopRetryTopicV1(h.Topic, h.ConsumerGroup)
	if needRetry && !order {
		p.popTopic(pr, retryTopic, true, randomQ, &res)
	}
	if h.QueueID < 0 {
		p.popTopic(pr, h.Topic, false, randomQ, &res)
	} else {
		p.popQueue(pr, h.Topic, h.QueueID, false, &res)
	}
	if !needRetry && res.count < int(h.MaxMsgNums) && !order {
		p.popTopic(pr, retryTopic, true, randomQ, &res)
	}
	return res
}

func (p *popService) popTopic(pr *popRequest, topic string, retry bool, randomQ int, res *popResult) {
	tc, ok := p.b.topics.get(topic)
	if !ok {
		return
	}
	n := int(tc.ReadQueueNums)
	for i := range n {
		p.popQueue(pr, topic, int32((randomQ+i)%n), retry, res)
	}
}

func (p *popService) queueLock(key string) *sync.Mutex {
	if v, ok := p.qlocks.Load(key); ok {
		return v.(*sync.Mutex)
	}
	v, _ := p.qlocks.LoadOrStore(key, new(sync.Mutex))
	return v.(*sync.Mutex)
}

func popLockKey(topic, group string, queue int32) string {
	return topic + "@" + group + "@" + strconv.Itoa(int(queue))
}

// popOffset returns the group's offset of the queue (Java getPopOffset):
// the committed one, or else the initial one (the min offset with initMode
// MIN or on a retry topic; the max offset minus one otherwise, or 0 when
// the queue's first message is still there), committed when init is set.
func (p *popService) popOffset(group, topic string, queue int32, initMode int32, init bool) (int64, error) {
	off, ok, err := p.b.store.QueryOffset(group, topic, queue)
	if err != nil {
		return 0, err
	}
	if ok {
		return off, nil
	}
	minOff, err := p.b.store.MinOffset(topic, queue)
	if err != nil {
		return 0, err
	}
	if initMode == popInitModeMin || isRetryTopicName(topic) {
		off = minOff
	} else {
		maxOff, err := p.b.store.MaxOffset(topic, queue)
		if err != nil {
			return 0, err
		}
		if minOff <= 0 && maxOff > 0 {
			off = 0 // initPopOffsetByCheckMsgInMem: the first message is still there
		} else {
			off = max(maxOff-1, 0)
		}
	}
	if init {
		if err := p.b.store.CommitOffset(group, topic, queue, off); err != nil {
			return 0, err
		}
	}
	return off, nil
}

func isRetryTopicName(t string) bool {
	return len(t) >= len(retryPrefix) && t[:len(retryPrefix)] == retryPrefix
}

// popQueue pops from one queue (Java popMsgFromQueue).
func (p *popService) popQueue(pr *popRequest, topic string, queue int32, retry bool, res *popResult) {
	h := &pr.h
	group, order := h.ConsumerGroup, h.Order.V
	maxOff, err := p.b.store.MaxOffset(topic, queue)
	if err != nil {
		return
	}
	lk := p.queueLock(popLockKey(topic, group, queue))
	if !lk.TryLock() {
		if off, err := p.popOffset(group, topic, queue, h.InitMode, false); err == nil && !order {
			res.restNum += max(maxOff-off, 0)
		}
		return
	}
	defer lk.Unlock()
	off, err := p.popOffset(group, topic, queue, h.InitMode, true)
	if err != nil {
		p.b.log.Warn("broker: pop offset", "topic", topic, "group", group, "queue", queue, "err", err)
		return
	}
	minOff, err := p.b.store.MinOffset(topic, queue)
	if err != nil {
		return
	}
	if off < minOff || off > maxOff {
		// The stored offset is off the queue: start from where it can
		// be read (Java commits the next begin offset then).
		off = min(max(off, minOff), maxOff)
		if err := p.b.store.CommitOffset(group, topic, queue, off); err != nil {
			return
		}
	}
	if order && p.orderBlocked(topic, group, queue, h.AttemptID, h.InvisibleTime) {
		return
	}
	want := int(h.MaxMsgNums) - res.count
	if want <= 0 {
		res.restNum += maxOff - off
		return
	}
	bp := p.b.getBuf()
	defer p.b.putBuf(bp)
	recs := (*bp)[:0]
	var offsets []int64
	next, err := p.b.store.Get(topic, queue, off, want, int(p.b.live.pullMaxBytes.Load()), func(rec []byte, code int64) bool {
		if !pr.filter.match(rec, code) {
			return false
		}
		recs = append(recs, rec...)
		return true
	})
	*bp = recs
	if err != nil {
		p.b.log.Error("broker: pop read failed", "topic", topic, "queue", queue, "offset", off, "err", err)
		return
	}
	if len(recs) > 0 {
		if err := protocol.DecodeRecords(recs, func(m *protocol.MessageExt) bool {
			offsets = append(offsets, m.QueueOffset)
			return true
		}); err != nil {
			p.b.log.Error("broker: pop decode failed", "topic", topic, "queue", queue, "err", err)
			return
		}
	}
	if len(offsets) > 0 {
		if order {
			res.orderInfo = p.orderUpdate(topic, group, queue, h.AttemptID, res.popTime, h.InvisibleTime, offsets, res.orderInfo)
			// The offset stays at the batch's start until acks move it.
		} else {
			ck := &popCK{id: ckID{group: group, topic: topic, queue: queue, start: off, popTime: res.popTime},
				invisible: h.InvisibleTime, reviveQid: res.reviveQid, offsets: offsets}
			// The checkpoint and the offset past its messages in one
			// batch: after any crash either both hold (the messages come
			// back by revive) or neither (they are popped again).
			mb := p.b.store.NewMetaBatch()
			putCK(mb, ck)
			mb.CommitOffset(group, topic, queue, next)
			if err := mb.Commit(p.syncMeta()); err != nil {
				p.b.log.Error("broker: pop checkpoint not stored; nothing popped", "topic", topic, "queue", queue, "err", err)
				return
			}
			p.index(ck)
		}
		res.startInfo = protocol.AppendStartOffsetInfo(res.startInfo, topic, queue, off)
		res.msgInfo = protocol.AppendMsgOffsetInfo(res.msgInfo, topic, queue, offsets)
		if retry {
			res.body = p.recodeRetry(res.body, recs, h.Topic, off, res.popTime, h.InvisibleTime, res.reviveQid)
		} else {
			res.body = append(res.body, recs...)
		}
		res.count += len(offsets)
		if retry {
			p.noteRetryTopic(topic, h.Topic, group)
		}
	} else if next > off {
		// Only messages the filter dropped: move past them.
		if err := p.b.store.CommitOffset(group, topic, queue, next); err != nil {
			p.b.log.Warn("broker: pop offset commit failed", "topic", topic, "queue", queue, "err", err)
		}
	}
	res.restNum += maxOff - next
}

// recodeRetry appends the records of a pop retry topic with the original
// topic and their receipt handle (POP_CK) set, as Java does unless
// popResponseReturnActualRetryTopic: the client then sees the topic it
// popped and acks the retry topic's queue.
func (p *popService) recodeRetry(dst, recs []byte, topic string, start, popTime, invisible int64, reviveQid int32) []byte {
	_ = protocol.DecodeRecords(recs, func(m *protocol.MessageExt) bool {
		c := *m
		if _, ok := c.Property(protocol.PropPopCK); !ok {
			ei := protocol.ExtraInfo{CkQueueOffset: start, PopTime: popTime, InvisibleTime: invisible, ReviveQID: reviveQid,
				Retry: protocol.PopRetryFlag(m.Topic), BrokerName: p.b.cfg.brokerName, QueueID: m.QueueID, MsgQueueOffset: m.QueueOffset}
			c.Properties = string(protocol.AppendProperty([]byte(c.Properties), protocol.PropPopCK, ei.String()))
		}
		c.Topic = topic
		var err error
		if dst, err = c.AppendRecord(dst); err != nil {
			p.b.log.Error("broker: re-encoding a pop retry message failed", "err", err)
		}
		return true
	})
	return dst
}

func (p *popService) noteRetryTopic(retry, topic, group string) {
	p.mu.Lock()
	if _, ok := p.mu.retryOf[retry]; !ok {
		p.mu.retryOf[retry] = topicGroup{topic: topic, group: group}
	}
	p.mu.Unlock()
}

// ---- ACK_MESSAGE, BATCH_ACK_MESSAGE ----

func (p *popService) processAck(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var h protocol.AckMessageRequestHeader
	if err := h.Decode(req); err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	if resp := p.checkAckTarget(req, h.Topic, h.QueueID, h.Offset, true); resp != nil {
		return resp, nil
	}
	ei, err := protocol.ParseExtraInfo(h.ExtraInfo)
	if err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	if err := p.ensureLoaded(); err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	if ei.Order() {
		if resp := p.ackOrderly(req, h.Topic, h.ConsumerGroup, h.QueueID, h.Offset, ei.PopTime); resp != nil {
			return resp, nil
		}
		return respond(req, protocol.ResSuccess, ""), nil
	}
	mb := p.b.store.NewMetaBatch()
	p.ack(mb, ckID{group: h.ConsumerGroup, topic: h.Topic, queue: h.QueueID, start: ei.CkQueueOffset, popTime: ei.PopTime}, h.Offset)
	if err := p.commitAcks(mb, h.ConsumerGroup, h.Topic); err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	return respond(req, protocol.ResSuccess, ""), nil
}

// checkAckTarget applies Java's checks of an ack or invisible-time change:
// the topic exists (TOPIC_NOT_EXIST), 0 <= queue < readQueueNums
// (MESSAGE_ILLEGAL), min <= offset <= max, or < max for a change
// (NO_MESSAGE).
func (p *popService) checkAckTarget(req *protocol.Command, topic string, queue int32, off int64, ack bool) *protocol.Command {
	tc, ok := p.b.topics.get(topic)
	if !ok {
		return respond(req, protocol.ResTopicNotExist, "topic["+topic+"] not exist, apply first please!")
	}
	if queue < 0 || queue >= tc.ReadQueueNums {
		return respond(req, protocol.ResMessageIllegal, fmt.Sprintf("queueId[%d] is illegal, topic:[%s] topicConfig.readQueueNums:[%d]",
			queue, topic, tc.ReadQueueNums))
	}
	minOff, err := p.b.store.MinOffset(topic, queue)
	if err != nil {
		return respond(req, protocol.ResSystemError, err.Error())
	}
	maxOff, err := p.b.store.MaxOffset(topic, queue)
	if err != nil {
		return respond(req, protocol.ResSystemError, err.Error())
	}
	if off < minOff || off > maxOff || (!ack && off == maxOff) {
		return respond(req, protocol.ResNoMessage, fmt.Sprintf("offset is illegal, key:%s@%d, commit:%d, store:%d~%d", topic, queue, off, minOff, maxOff))
	}
	return nil
}

func (p *popService) processBatchAck(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var body protocol.BatchAckMessageRequestBody
	if len(req.Body) > 0 {
		if err := body.Decode(req.Body); err != nil {
			return respond(req, protocol.ResSystemError, err.Error()), nil
		}
	}
	if len(body.Acks) == 0 {
		return respond(req, protocol.ResNoMessage, ""), nil
	}
	if err := p.ensureLoaded(); err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	resp := respond(req, protocol.ResSuccess, "")
	mb := p.b.store.NewMetaBatch()
	defer mb.Close()
	for _, a := range body.Acks {
		topic, err := protocol.PopRealTopic(a.Topic, a.ConsumerGroup, a.Retry)
		if err != nil {
			return respond(req, protocol.ResSystemError, err.Error()), nil
		}
		minOff, err1 := p.b.store.MinOffset(topic, a.QueueID)
		maxOff, err2 := p.b.store.MaxOffset(topic, a.QueueID)
		if err1 != nil || err2 != nil {
			continue // Java logs "Illegal topic or queue found when batch ack" and goes on
		}
		for _, bit := range a.Bits {
			off := a.StartOffset + int64(bit)
			if off < minOff || off > maxOff {
				continue
			}
			if a.ReviveQueueID == protocol.PopOrderReviveQueue {
				if r := p.ackOrderly(req, topic, a.ConsumerGroup, a.QueueID, off, a.PopTime); r != nil {
					resp = r
				}
				continue
			}
			p.ack(mb, ckID{group: a.ConsumerGroup, topic: topic, queue: a.QueueID, start: a.StartOffset, popTime: a.PopTime}, off)
		}
	}
	if err := p.commitAcks(mb, body.Acks[0].ConsumerGroup, body.Acks[0].Topic); err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	return resp, nil
}

// ---- CHANGE_MESSAGE_INVISIBLETIME ----

func (p *popService) processChangeInvisible(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var h protocol.ChangeInvisibleTimeRequestHeader
	if err := h.Decode(req); err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	if resp := p.checkAckTarget(req, h.Topic, h.QueueID, h.Offset, false); resp != nil {
		return resp, nil
	}
	ei, err := protocol.ParseExtraInfo(h.ExtraInfo)
	if err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	if err := p.ensureLoaded(); err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	resp := respond(req, protocol.ResSuccess, "")
	rh := protocol.ChangeInvisibleTimeResponseHeader{ReviveQID: ei.ReviveQID}
	if ei.Order() {
		visible := p.orderChangeVisible(h.Topic, h.ConsumerGroup, h.QueueID, h.Offset, ei.PopTime, h.InvisibleTime)
		rh.PopTime, rh.InvisibleTime = ei.PopTime, visible-ei.PopTime
		rh.Encode(resp)
		return resp, nil
	}
	// A checkpoint of this one message with the new deadline, then the ack
	// of the original (Java appendCheckPointThenAckOrigin).
	now := p.nowMS()
	ck := &popCK{id: ckID{group: h.ConsumerGroup, topic: h.Topic, queue: h.QueueID, start: h.Offset, popTime: now},
		invisible: h.InvisibleTime, reviveQid: ei.ReviveQID, offsets: []int64{h.Offset}}
	mb := p.b.store.NewMetaBatch()
	putCK(mb, ck)
	p.ack(mb, ckID{group: h.ConsumerGroup, topic: h.Topic, queue: h.QueueID, start: ei.CkQueueOffset, popTime: ei.PopTime}, h.Offset)
	if err := mb.Commit(p.syncMeta()); err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	p.index(ck)
	rh.PopTime, rh.InvisibleTime = now, h.InvisibleTime
	rh.Encode(resp)
	return resp, nil
}

// ---- NOTIFICATION, POLLING_INFO ----

func (p *popService) processNotification(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var h protocol.NotificationRequestHeader
	if err := h.Decode(req); err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	if resp := p.checkTopicGroup(req, h.Topic, h.QueueID, h.ConsumerGroup); resp != nil {
		return resp, nil
	}
	if err := p.ensureLoaded(); err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	if h.BornTime == 0 {
		h.BornTime = time.Now().UnixMilli()
	}
	pr := &popRequest{rc: rc, notify: true, index: -1, filter: matchAll,
		h: protocol.PopMessageRequestHeader{ConsumerGroup: h.ConsumerGroup, Topic: h.Topic, QueueID: h.QueueID,
			PollTime: h.PollTime, BornTime: h.BornTime, Order: h.Order, AttemptID: h.AttemptID}}
	pr.deadline = time.UnixMilli(h.BornTime + h.PollTime)
	p.serve(pr)
	return nil, nil
}

func (p *popService) serveNotification(pr *popRequest) {
	has := p.hasMessage(&pr.h)
	if !has && pr.h.PollTime > 0 && time.Now().Before(pr.deadline) {
		switch p.waiters.park(pr) {
		case parked:
			if p.hasMessage(&pr.h) {
				p.waiters.wake(pr.h.Topic, pr.h.ConsumerGroup, -2)
			}
			return
		case parkFull:
			p.answerNotification(pr, false, true)
			return
		}
	}
	p.answerNotification(pr, has, false)
}

func (p *popService) answerNotification(pr *popRequest, has, full bool) {
	resp := protocol.NewResponse(pr.rc.Request(), protocol.ResSuccess, "")
	rh := protocol.NotificationResponseHeader{HasMsg: has, PollingFull: protocol.Some(full)}
	rh.Encode(resp)
	_ = pr.rc.Respond(resp)
}

// hasMessage reports whether a pop of h's queue (or topic) would find a
// message beyond the group's offset, or in its pop retry topic
// (NotificationProcessor.hasMsgFromTopic/Queue).
func (p *popService) hasMessage(h *protocol.PopMessageRequestHeader) bool {
	check := func(topic string, queue int32) bool {
		maxOff, err := p.b.store.MaxOffset(topic, queue)
		if err != nil {
			return false
		}
		off, err := p.popOffset(h.ConsumerGroup, topic, queue, popInitModeMin+1, false)
		if err != nil {
			return false
		}
		if h.Order.V && p.orderBlocked(topic, h.ConsumerGroup, queue, h.AttemptID, 0) {
			return false
		}
		return maxOff > off
	}
	all := func(topic string) bool {
		tc, ok := p.b.topics.get(topic)
		if !ok {
			return false
		}
		for q := range tc.ReadQueueNums {
			if check(topic, q) {
				return true
			}
		}
		return false
	}
	if h.QueueID < 0 {
		if all(h.Topic) {
			return true
		}
	} else if check(h.Topic, h.QueueID) {
		return true
	}
	return !h.Order.V && all(protocol.PopRetryTopicV1(h.Topic, h.ConsumerGroup))
}

func (p *popService) processPollingInfo(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var h protocol.PollingInfoRequestHeader
	if err := h.Decode(req); err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	tc, ok := p.b.topics.get(h.Topic)
	if !ok {
		return respond(req, protocol.ResTopicNotExist, "topic["+h.Topic+"] not exist, apply first please!"), nil
	}
	if !protocol.PermReadable(tc.Perm) {
		return respond(req, protocol.ResNoPermission, "the topic["+h.Topic+"] peeking message is forbidden"), nil
	}
	if h.QueueID >= tc.ReadQueueNums {
		return respond(req, protocol.ResInvalidParameter, fmt.Sprintf("queueId[%d] is illegal, topic:[%s] topicConfig.readQueueNums:[%d]",
			h.QueueID, h.Topic, tc.ReadQueueNums)), nil
	}
	gc, ok := p.b.groupConfig(h.ConsumerGroup, false)
	if !ok {
		return respond(req, protocol.ResSubscriptionGroupNotExist, "subscription group ["+h.ConsumerGroup+"] does not exist"), nil
	}
	if !gc.ConsumeEnable {
		return respond(req, protocol.ResNoPermission, "subscription group no permission, "+h.ConsumerGroup), nil
	}
	resp := respond(req, protocol.ResSuccess, "")
	rh := protocol.PollingInfoResponseHeader{PollingNum: int32(p.waiters.count(h.Topic, h.ConsumerGroup, h.QueueID))}
	rh.Encode(resp)
	return resp, nil
}

// notifyArrival wakes the pops parked for topic's queue (the store's
// notify hook, through the long-poll service; a pop retry topic wakes the
// pops of its topic).
func (p *popService) notifyArrival(topic string, queue int32) {
	if p.waiters.n.Load() == 0 {
		return
	}
	if isRetryTopicName(topic) {
		p.mu.Lock()
		tg, ok := p.mu.retryOf[topic]
		p.mu.Unlock()
		if ok {
			p.waiters.wake(tg.topic, tg.group, -2)
			return
		}
	}
	p.waiters.wake(topic, "", queue)
}

// errPopClosed is returned while the broker stops.
var errPopClosed = errors.New("broker: pop service closed")
