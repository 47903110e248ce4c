package broker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/runnel-dev/runnel/transport/broker/internal/store"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// slaveRefusesWrites is the remark of a slave's refusal of a send (Java's
// remark for a store that refuses the put: a slave's among the reasons).
const slaveRefusesWrites = "service not available now. It may be caused by one of the following reasons: " +
	"the broker's disk is full, messages are put to the slave, message store has been shut down, etc. " +
	"(this broker is a slave: send to its master)"

// Values a Java broker adds to every send response.
const (
	defaultRegion = "DefaultRegion"
	// maxBatchItems bounds the messages of one batch.
	maxBatchItems = 1 << 16
)

// respond builds a response with code and remark.
func respond(req *protocol.Command, code int32, remark string) *protocol.Command {
	return protocol.NewResponse(req, code, remark)
}

// errorResponse answers err: the code and remark of a *protocol.Error, or
// SYSTEM_ERROR with the error text.
func errorResponse(req *protocol.Command, err error) *protocol.Command {
	var pe *protocol.Error
	if errors.As(err, &pe) {
		return protocol.NewResponse(req, pe.Code, pe.Remark)
	}
	return protocol.NewResponse(req, protocol.ResSystemError, err.Error())
}

func illegal(remark string) error {
	return &protocol.Error{Code: protocol.ResMessageIllegal, Remark: remark}
}

// processSend serves SEND_MESSAGE (10), SEND_MESSAGE_V2 (310),
// SEND_BATCH_MESSAGE (320) and SEND_REPLY_MESSAGE(_V2) (324, 325).
//
// Checks, in order: header decodes (INVALID_PARAMETER); broker running
// (SERVICE_NOT_AVAILABLE); body and properties sizes (MESSAGE_ILLEGAL,
// checked first so that an illegal message has no side effect such as
// creating its topic); topic name (INVALID_PARAMETER); system topic
// (NO_PERMISSION); topic exists or is auto-created from the default topic
// (TOPIC_NOT_EXIST); topic writable (NO_PERMISSION); queue id below the
// queue count (INVALID_PARAMETER; negative = random writable queue); then
// batch or transaction specifics and the beforeStore hook.
func (b *Broker) processSend(ctx context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	return b.serveSend(ctx, rc, false)
}

// processSendInline is processSend for the codes registered with
// remoting's HandleInline: it runs on the connection's reader goroutine, so
// it must not block. The common send (an existing, non-retry topic, one
// message) only validates, encodes and hands the record to the store's
// committer (Store.PutAsync), answering later, or, when its connection has
// nothing else in flight and the store is idle in ASYNC flush mode, commits
// it right there (Store.PutAsyncInline). A send whose path may block
// on a synchronous Pebble write or a store round is handed to a
// broker-owned goroutine instead (sendMayBlock, handOff).
//
// Ordering per connection: inline sends reach the store's committer in the
// order the connection carried them. A handed-off send may be overtaken by
// later sends of the same connection (as any send could be when every
// request ran on its own handler goroutine); producers that need order wait
// for each answer before the next send, as RocketMQ's orderly producers do.
func (b *Broker) processSendInline(ctx context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	return b.serveSend(ctx, rc, true)
}

// serveSend is processSend; inline says it runs on a reader goroutine.
func (b *Broker) serveSend(ctx context.Context, rc *remoting.RequestCtx, inline bool) (*protocol.Command, error) {
	req := rc.Request()
	var h protocol.SendMessageRequestHeader
	var err error
	switch req.Code {
	case protocol.ReqSendMessage, protocol.ReqSendReplyMessage:
		err = h.Decode(req)
	default:
		var v2 protocol.SendMessageRequestHeaderV2
		err = v2.Decode(req)
		h = v2.ToV1()
	}
	if err != nil {
		return respond(req, protocol.ResInvalidParameter, err.Error()), nil
	}
	if !b.running() {
		return respond(req, protocol.ResServiceNotAvailable, "broker is shutting down"), nil
	}
	if b.isSlave() {
		return respond(req, protocol.ResServiceNotAvailable, slaveRefusesWrites), nil
	}
	b.stats.sent(len(req.Body)) // stats.go
	batch := h.Batch.Or(false)
	if !batch {
		b.stats.puts.Add(1)
	}
	if batch && len(req.Body) > b.cfg.maxBatchBytes {
		return respond(req, protocol.ResMessageIllegal, "batch body size "+strconv.Itoa(len(req.Body))+
			" exceeds the maximum batch size "+strconv.Itoa(b.cfg.maxBatchBytes)+" bytes"), nil
	}
	if !batch && len(req.Body) > b.cfg.maxMessageSize {
		return respond(req, protocol.ResMessageIllegal, "message body size "+strconv.Itoa(len(req.Body))+
			" exceeds the maximum "+strconv.Itoa(b.cfg.maxMessageSize)), nil
	}
	if len(h.Properties) > protocol.MaxPropertiesLength {
		return respond(req, protocol.ResMessageIllegal, "message properties length "+strconv.Itoa(len(h.Properties))+
			" exceeds 32767"), nil
	}
	if inline && b.sendMayBlock(&h) {
		return b.handOff(ctx, rc, &h)
	}
	return b.sendChecked(ctx, rc, &h)
}

// sendMayBlock reports whether the send with header h may block beyond a
// full store queue, so that it must not run on a reader goroutine: a batch
// (its store Put waits for the round), a topic not known yet (auto-create
// persists the topic config with a synced Pebble write), a %RETRY% topic
// (the group or its DLQ topic may be created) and the first timer message
// (the timer topic may be created). Everything else the send path does
// (the beforeStore rewrite to a delay level, half messages, PutAsync) does
// not block.
func (b *Broker) sendMayBlock(h *protocol.SendMessageRequestHeader) bool {
	if h.Batch.Or(false) || strings.HasPrefix(h.Topic, retryPrefix) {
		return true
	}
	if _, ok := b.topics.get(h.Topic); !ok {
		return true
	}
	// "TIMER_DEL" prefixes the three timer properties: a cheap filter.
	if _, ok := b.topics.get(timerTopic); !ok && strings.Contains(h.Properties, "TIMER_DEL") {
		for _, k := range [...]string{protocol.PropTimerDelaySec, protocol.PropTimerDelayMS, protocol.PropTimerDeliverMS} {
			if _, ok := protocol.PropertyValue(h.Properties, k); ok {
				return true
			}
		}
	}
	return false
}

// maxHandOffs bounds the sends handed off the reader goroutines at a time
// (per broker). A reader that finds no slot waits, which throttles its own
// connection only.
const maxHandOffs = 64

// handOff serves the checked send h on a goroutine the broker owns,
// answering rc from there (the request is deferred). It waits for a slot
// (maxHandOffs) or for ctx, the connection's lifetime, to end.
func (b *Broker) handOff(ctx context.Context, rc *remoting.RequestCtx, h *protocol.SendMessageRequestHeader) (*protocol.Command, error) {
	select {
	case b.handOffs <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("broker: send: %w", ctx.Err())
	}
	hh := *h
	rc.Defer()
	// The remoting server joins its processors before stop joins b.wg, so
	// this Add never races with that Wait.
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		defer func() { <-b.handOffs }()
		resp := b.sendHandedOff(ctx, rc, &hh)
		if resp != nil {
			_ = rc.Respond(resp) // a failure closed the connection, which reports it
		}
	}()
	return nil, nil
}

// sendHandedOff runs sendChecked, turning an error or a panic into the
// response (as the remoting server does for its processors).
func (b *Broker) sendHandedOff(ctx context.Context, rc *remoting.RequestCtx, h *protocol.SendMessageRequestHeader) (resp *protocol.Command) {
	req := rc.Request()
	defer func() {
		if r := recover(); r != nil {
			b.log.Error("broker: send panicked", "code", req.Code, "panic", r, "stack", string(debug.Stack()))
			resp = respond(req, protocol.ResSystemError, fmt.Sprintf("broker: send panic: %v", r))
		}
	}()
	resp, err := b.sendChecked(ctx, rc, h)
	if err != nil {
		return errorResponse(req, err)
	}
	return resp
}

// sendChecked serves a send whose header decoded and whose sizes were
// checked: the target topic and queue, then the batch or single message.
func (b *Broker) sendChecked(ctx context.Context, rc *remoting.RequestCtx, h *protocol.SendMessageRequestHeader) (*protocol.Command, error) {
	req := rc.Request()
	batch := h.Batch.Or(false)
	var err error
	var items []batchItem
	if batch {
		if items, err = b.decodeBatch(h.Topic, req.Body); err != nil {
			return errorResponse(req, err), nil
		}
	}
	tc, queueID, err := b.checkSendTarget(h)
	if err != nil {
		return errorResponse(req, err), nil
	}
	tmpl := InboundMessage{
		Topic:             h.Topic,
		QueueID:           queueID,
		Flag:              h.Flag,
		Body:              req.Body,
		Properties:        h.Properties,
		SysFlag:           h.SysFlag,
		BornTimestamp:     h.BornTimestamp,
		BornHost:          peerAddr(rc.RemoteAddr()),
		ReconsumeTimes:    h.ReconsumeTimes.Or(0),
		MaxReconsumeTimes: h.MaxReconsumeTimes.Or(-1),
		ProducerGroup:     h.ProducerGroup,
		Code:              req.Code,
		ClientVersion:     req.Version,
		Conn:              rc.Conn(),
	}
	if tc.TopicFilterType == protocol.TopicFilterMultiTag {
		tmpl.SysFlag |= protocol.SysFlagMultiTags
	}
	if batch {
		return b.sendBatch(ctx, req, &tmpl, items)
	}
	return b.sendOne(ctx, rc, &tmpl)
}

// checkSendTarget validates the topic and queue of a send, auto-creating
// the topic when allowed, and picks a queue for a negative queue id.
func (b *Broker) checkSendTarget(h *protocol.SendMessageRequestHeader) (TopicConfig, int32, error) {
	if err := validateTopic(h.Topic); err != nil {
		return TopicConfig{}, 0, &protocol.Error{Code: protocol.ResInvalidParameter, Remark: err.Error()}
	}
	if notSendable(h.Topic) {
		return TopicConfig{}, 0, &protocol.Error{Code: protocol.ResNoPermission,
			Remark: "sending message to topic[" + h.Topic + "] is forbidden"}
	}
	tc, ok := b.topics.get(h.Topic)
	if !ok {
		var err error
		tc, ok, err = b.autoCreateTopic(h.Topic, h.DefaultTopic, h.DefaultTopicQueueNums)
		if err != nil {
			return TopicConfig{}, 0, &protocol.Error{Code: protocol.ResSystemError, Remark: err.Error()}
		}
		if !ok {
			return TopicConfig{}, 0, &protocol.Error{Code: protocol.ResTopicNotExist,
				Remark: "topic[" + h.Topic + "] not exist, apply first please!"}
		}
	}
	if !protocol.PermWritable(tc.Perm) {
		return TopicConfig{}, 0, &protocol.Error{Code: protocol.ResNoPermission,
			Remark: "the topic[" + h.Topic + "] sending message is forbidden"}
	}
	qid := h.QueueID
	if n := queueCount(tc); qid >= n {
		return TopicConfig{}, 0, &protocol.Error{Code: protocol.ResInvalidParameter,
			Remark: "queueId " + strconv.Itoa(int(qid)) + " is illegal, topic " + h.Topic + " has " + strconv.Itoa(int(n)) + " queues"}
	}
	if qid < 0 {
		if tc.WriteQueueNums < 1 {
			return TopicConfig{}, 0, &protocol.Error{Code: protocol.ResNoPermission,
				Remark: "the topic[" + h.Topic + "] has no writable queue"}
		}
		qid = rand.Int32N(tc.WriteQueueNums)
	}
	return tc, qid, nil
}

// decodeBatch decodes and checks a batch body (protocol §4.4).
func (b *Broker) decodeBatch(topic string, body []byte) ([]batchItem, error) {
	if strings.HasPrefix(topic, retryPrefix) {
		return nil, illegal("batch messages cannot be sent to retry topic " + topic)
	}
	if len(topic) > maxTopicLen {
		return nil, illegal("batch topic is longer than 127 bytes")
	}
	if len(body) == 0 {
		return nil, illegal("empty batch")
	}
	items := make([]batchItem, 0, 8)
	err := protocol.DecodeBatch(body, maxBatchItems, func(flag int32, body []byte, props string) error {
		if len(items) == b.cfg.maxBatchMsgs {
			return illegal("batch holds more than " + strconv.Itoa(b.cfg.maxBatchMsgs) +
				" messages, the broker's maximum batch size")
		}
		if len(body) > b.cfg.maxMessageSize {
			return illegal("batch message body size " + strconv.Itoa(len(body)) +
				" exceeds the maximum " + strconv.Itoa(b.cfg.maxMessageSize))
		}
		if len(props) > protocol.MaxPropertiesLength {
			return illegal("batch item properties longer than 32767")
		}
		items = append(items, batchItem{flag: flag, body: body, props: props})
		return nil
	})
	if err != nil {
		var pe *protocol.Error
		if errors.As(err, &pe) {
			return nil, err
		}
		return nil, illegal(err.Error())
	}
	return items, nil
}

// isTransactional reports a transactional half message.
func isTransactional(sysFlag int32, props string) bool {
	if protocol.TransactionType(sysFlag) == protocol.SysFlagTransactionPrepared {
		return true
	}
	v, _ := protocol.PropertyValue(props, protocol.PropTransactionPrepared)
	return v == "true"
}

// sendOne stores one message. A transactional one (TRAN_MSG=true or the
// prepared sysFlag bits) is stored as a half message (transaction.go). The
// response names the queue the client chose, also when the message was
// moved to a schedule, timer or half queue (as Java does).
//
// The store round is not waited for: the request is deferred and answered
// by the store's committer once the round is durable (pendingSend), so
// the goroutine serving the connection (its reader, processSendInline)
// is free for the next request at once. The one exception is the send of
// a connection with nothing else in flight in ASYNC flush mode, which the
// store commits and answers on the calling goroutine when its committer is
// idle (Store.PutAsyncInline): its round is one Pebble batch without an
// fsync, cheaper than waking the committer for it.
func (b *Broker) sendOne(ctx context.Context, rc *remoting.RequestCtx, tmpl *InboundMessage) (*protocol.Command, error) {
	// The message lives in the pooled pendingSend from here on, so that the
	// hooks' pointer to it does not move the caller's template to the heap.
	p := b.sends.Get().(*pendingSend)
	p.m = *tmpl
	resp, err := b.prepareOne(ctx, rc, p)
	if resp != nil || err != nil {
		p.release()
	}
	return resp, err
}

// prepareOne is sendOne with the message in p.m: it completes, checks and
// rewrites it, then hands it to the store, deferring the request (nil, nil;
// p then belongs to the store round, or was released), or answers (p is
// the caller's to release).
func (b *Broker) prepareOne(ctx context.Context, rc *remoting.RequestCtx, p *pendingSend) (*protocol.Command, error) {
	req := rc.Request()
	m := &p.m
	props, uniq := b.completeProperties(m.Properties)
	if len(props) > protocol.MaxPropertiesLength {
		return respond(req, protocol.ResMessageIllegal, "message properties longer than 32767 after the broker's additions"), nil
	}
	m.Properties = props
	if d, ok := protocol.PropertyValue(props, protocol.PropDelayLevel); ok {
		if v, err := strconv.ParseInt(d, 10, 32); err == nil {
			m.DelayLevel = int32(v)
		}
	}
	half := isTransactional(m.SysFlag, m.Properties)
	if half && m.ReconsumeTimes > 0 && m.DelayLevel > 0 {
		// An old client's send-back of a transactional message: a normal
		// message (Java's exception).
		half = false
		m.SysFlag = protocol.SetTransactionType(m.SysFlag, protocol.SysFlagTransactionNotType)
	} else if half {
		// Marked prepared so that the delay logic leaves it alone: a half
		// message is delayed when it is committed.
		m.SysFlag = protocol.SetTransactionType(m.SysFlag, protocol.SysFlagTransactionPrepared)
	}
	queueID := m.QueueID
	if f := b.ext.beforeStore; f != nil {
		if err := f(ctx, m); err != nil {
			return errorResponse(req, err), nil
		}
		if m.QueueID < 0 {
			return respond(req, protocol.ResSystemError, "negative queue id after rewrite"), nil
		}
	}
	if half {
		if err := toHalf(m, uniq); err != nil {
			return errorResponse(req, err), nil
		}
	}
	p.ctx, p.rc, p.queueID, p.uniq, p.half = ctx, rc, queueID, uniq, half
	bp := b.getBuf()
	rec, tsPos, err := b.encodeRecord((*bp)[:0], &p.m)
	*bp = rec
	p.buf = bp
	if err != nil {
		return errorResponse(req, err), nil
	}
	var keys []string
	if !half {
		// A half message gets no key index entries: nothing looks it up by
		// key (see "Key index" in transaction.go); its committed message
		// is indexed in the real topic.
		keys = appendIndexKeys(p.keys[:0], p.m.Properties)
	}
	p.msgs[0] = store.PutMessage{
		Topic:             p.m.Topic,
		QueueID:           p.m.QueueID,
		Record:            rec,
		StoreTimestampPos: tsPos,
		TagsCode:          tagsCode(p.m.Properties),
		Keys:              keys,
	}
	rc.Defer() // before the Put: PutAsyncInline answers before it returns
	put := b.store.PutAsync
	if c := rc.Conn(); c.Handling() <= 1 && !c.ReadAhead() {
		// The only request of its connection in flight, and no other
		// request read behind it: nothing to group it with, so commit it
		// here when the store is idle, sparing the wake-up of the
		// committer. A connection pipelining requests leaves them to the
		// committer's group commit (and its responses to one write).
		put = b.store.PutAsyncInline
	}
	if err := put(ctx, p.msgs[:], p.res[:], p.done); err != nil {
		p.release()
		_ = rc.Respond(errorResponse(req, storeError(err))) // a failure closed the connection, which reports it
	}
	return nil, nil
}

// pendingSend is a single-message send whose store round is in flight: the
// continuation the store's committer runs (finish) to answer the request.
// Pooled; everything in it belongs to the round until finish runs.
type pendingSend struct {
	b *Broker
	// ctx is the request's ctx, handed to the afterStore hook; it lives as
	// long as the request.
	ctx     context.Context
	rc      *remoting.RequestCtx
	m       InboundMessage
	queueID int32 // the queue the client chose, answered in the response
	uniq    string
	half    bool
	buf     *[]byte // the encoded record
	msgs    [1]store.PutMessage
	res     [1]store.PutResult
	keys    [4]string
	done    func(err error) // finish, bound once
}

func newPendingSend(b *Broker) *pendingSend {
	p := &pendingSend{b: b}
	p.done = p.finish
	return p
}

// finish answers the request once its store round ended. It runs on the
// store's committer goroutine, or on the goroutine that called
// PutAsyncInline: everything it does is non-blocking (the
// afterStore hook must not block; Respond never does).
func (p *pendingSend) finish(err error) {
	b, rc := p.b, p.rc
	req := rc.Request()
	var resp *protocol.Command
	if err != nil {
		resp = errorResponse(req, storeError(err))
	} else {
		r := p.res[0]
		if p.half {
			b.tx.halfStored(p.msgs[0].Record, r.PhysicalOffset) // kept for END_TRANSACTION
		} else if f := b.ext.afterStore; f != nil {
			f(p.ctx, &p.m, StoredResult{
				QueueOffset:    r.QueueOffset,
				PhysicalOffset: r.PhysicalOffset,
				StoreTimestamp: r.StoreTimestamp,
				// MsgID left empty: the hook derives it if it needs it.
			})
		}
		resp = protocol.NewResponse(req, protocol.ResSuccess, "")
		rh := protocol.SendMessageResponseHeader{
			QueueID:       p.queueID,
			QueueOffset:   r.QueueOffset,
			TransactionID: p.uniq,
			MsgRegion:     defaultRegion,
			TraceOn:       protocol.Some(true),
		}
		if u, ok := p.m.Property(protocol.PropUniqKey); ok {
			rh.TransactionID = u
		}
		rh.Encode(resp)
		var idBuf [protocol.OffsetMsgIDLenV6]byte
		resp.SetExtBytes("msgId", protocol.AppendOffsetMsgID(idBuf[:0], b.host, r.PhysicalOffset))
		if b.syncMasterWait(p.m.Properties) {
			end := r.PhysicalOffset + int64(len(p.msgs[0].Record))
			p.release()
			b.awaitReplica(end, rc, resp, false) // answers once a slave has it
			return
		}
	}
	p.release()
	_ = rc.Respond(resp) // a failure closed the connection, which reports it
}

// release returns p and its record buffer to their pools.
func (p *pendingSend) release() {
	if p.buf != nil {
		p.b.putBuf(p.buf)
	}
	b := p.b
	*p = pendingSend{b: b, done: p.done}
	b.sends.Put(p)
}

func (b *Broker) sendBatch(ctx context.Context, req *protocol.Command, tmpl *InboundMessage, items []batchItem) (*protocol.Command, error) {
	if isTransactional(tmpl.SysFlag, tmpl.Properties) {
		return respond(req, protocol.ResMessageIllegal, "batch messages cannot be transactional"), nil
	}
	res, end, err := b.storeBatch(ctx, tmpl, items)
	if err != nil {
		return errorResponse(req, err), nil
	}
	code := protocol.ResSuccess
	if b.syncMasterWait(tmpl.Properties) {
		code = b.awaitReplicaBlocking(ctx, end)
	}
	b.stats.puts.Add(int64(len(res)))
	var sb strings.Builder
	sb.Grow(len(res) * (protocol.OffsetMsgIDLenV6 + 1))
	var idBuf [protocol.OffsetMsgIDLenV6]byte
	for i, r := range res {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.Write(protocol.AppendOffsetMsgID(idBuf[:0], b.host, r.PhysicalOffset))
	}
	resp := protocol.NewResponse(req, code, "")
	rh := protocol.SendMessageResponseHeader{
		MsgID:       sb.String(),
		QueueID:     tmpl.QueueID,
		QueueOffset: res[0].QueueOffset,
		MsgRegion:   defaultRegion,
		TraceOn:     protocol.Some(true),
	}
	rh.Encode(resp)
	return resp, nil
}

// completeProperties adds UNIQ_KEY when missing and sets CLUSTER, as a
// Java broker does for every non-batch message. It returns the properties
// and the UNIQ_KEY. One allocation when something is added.
func (b *Broker) completeProperties(props string) (string, string) {
	uniq, hasUniq := protocol.PropertyValue(props, protocol.PropUniqKey)
	cluster, hasCluster := protocol.PropertyValue(props, protocol.PropCluster)
	if hasUniq && hasCluster && cluster == b.cfg.clusterName {
		return props, uniq
	}
	bp := b.getBuf()
	defer b.putBuf(bp)
	buf := (*bp)[:0]
	if hasCluster {
		buf = protocol.AppendPropertiesExcept(buf, props, protocol.PropCluster)
	} else {
		buf = append(buf, props...)
		if len(buf) > 0 && buf[len(buf)-1] != protocol.PropSeparator {
			buf = append(buf, protocol.PropSeparator)
		}
	}
	uStart, uEnd := -1, -1
	if !hasUniq {
		buf = append(buf, protocol.PropUniqKey...)
		buf = append(buf, protocol.PropNameValueSeparator)
		uStart = len(buf)
		buf = b.uniq.AppendNext(buf)
		uEnd = len(buf)
		buf = append(buf, protocol.PropSeparator)
	}
	buf = protocol.AppendProperty(buf, protocol.PropCluster, b.cfg.clusterName)
	*bp = buf
	out := string(buf)
	if uStart >= 0 {
		uniq = out[uStart:uEnd]
	}
	return out, uniq
}
