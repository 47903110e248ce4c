package broker

import (
	"context"
	"encoding/binary"
	"slices"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// Remarks of pull responses: the store status names of Java's
// GetMessageStatus (clients ignore them; they help when reading traces).
const (
	statusFound           = "FOUND"
	statusNoMatched       = "NO_MATCHED_MESSAGE"
	statusNoMessage       = "NO_MESSAGE_IN_QUEUE"
	statusTooSmall        = "OFFSET_TOO_SMALL"
	statusOverflowOne     = "OFFSET_OVERFLOW_ONE"
	statusOverflowBadly   = "OFFSET_OVERFLOW_BADLY"
	statusFoundNull       = "OFFSET_FOUND_NULL"
	statusServiceShutdown = "broker is shutting down"
)

// tagFilter selects messages by tag. Matching compares the stored tags
// code first (cheap) and then the tag string itself, so neither a hash
// collision nor the Go client's UTF-8 hash variant can select a wrong
// message: the codes here are always computed by the broker (Java hash,
// the one stored) from the subscription's tag strings.
type tagFilter struct {
	all   bool
	tags  []string
	codes []int64
}

func newTagFilter(tags []string) tagFilter {
	if len(tags) == 0 {
		return tagFilter{all: true}
	}
	f := tagFilter{tags: tags, codes: make([]int64, len(tags))}
	for i, t := range tags {
		f.codes[i] = protocol.TagsHashCode(t)
	}
	return f
}

func (f *tagFilter) match(rec []byte, code int64) bool {
	if f.all {
		return true
	}
	if !slices.Contains(f.codes, code) {
		return false
	}
	m, _, err := protocol.DecodeRecord(rec)
	if err != nil {
		return false
	}
	return slices.Contains(f.tags, m.Tags())
}

// pullReq is one pull being served; when parked it waits in the longPoll
// tables (its fields below the line are guarded by longPoll.mu).
type pullReq struct {
	rc       *remoting.RequestCtx
	h        protocol.PullMessageRequestHeader
	filter   msgFilter // filter.go
	maxMsgs  int
	maxBytes int
	// scanFrom is where the next scan of the queue starts: the request's
	// offset, moved past messages the filter dropped while the pull was
	// parked (a woken pull whose new messages all failed the filter is
	// parked again, as Java's PullRequestHoldService keeps it).
	scanFrom int64

	// The group's brokerId and whichBrokerWhenConsumeSlowly, for
	// suggestWhichBrokerId; suggestSlave is set when the messages found
	// end far behind the log end (Java isSuggestPullingFromSlave).
	groupBroker, slowBroker int64
	suggestSlave            bool

	key      queueKey
	deadline time.Time
	index    int // position in the deadline heap, -1 when not in it
}

// queueKey names one queue of a topic.
type queueKey struct {
	topic string
	queue int32
}

// processPull serves PULL_MESSAGE (11) and LITE_PULL_MESSAGE (361).
//
// Checks, in Java's order: header (INVALID_PARAMETER); subscription group
// exists or is auto-created (SUBSCRIPTION_GROUP_NOT_EXIST) and may consume
// (NO_PERMISSION); topic exists (TOPIC_NOT_EXIST) and is readable
// (NO_PERMISSION); 0 <= queueId < readQueueNums (INVALID_PARAMETER); the
// subscription: from the request with the SUBSCRIPTION flag, else the one
// registered by heartbeat (SUBSCRIPTION_NOT_LATEST when older than the
// request's), else everything (gotcha 27); a TAG or SQL92 filter of it
// (filter.go: SUBSCRIPTION_PARSE_FAILED, FILTER_DATA_NOT_EXIST, and
// SYSTEM_ERROR for SQL92 without WithPropertyFilter, as Java answers).
func (b *Broker) processPull(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	p := &pullReq{rc: rc, index: -1}
	if err := p.h.Decode(req); err != nil {
		return respond(req, protocol.ResInvalidParameter, err.Error()), nil
	}
	if b.isSlave() && !b.cfg.ha.slaveRead {
		// A Java 5 slave without slaveReadEnable rejects pulls so.
		return respond(req, protocol.ResSystemBusy, "[REJECTREQUEST]system busy, start flow control for a while"), nil
	}
	if resp := b.checkPull(p); resp != nil {
		return resp, nil
	}
	b.stats.pulls.Add(1) // stats.go
	h := &p.h
	// A slave keeps no offset a pull carries (Java: storeOffsetEnable needs
	// a master); an UPDATE_CONSUMER_OFFSET it does keep.
	if h.SysFlag&protocol.PullFlagCommitOffset != 0 && h.CommitOffset >= 0 && !b.isSlave() {
		if err := b.store.CommitOffset(h.ConsumerGroup, h.Topic, h.QueueID, h.CommitOffset); err != nil {
			b.log.Warn("broker: commit offset piggybacked on a pull failed", "group", h.ConsumerGroup,
				"topic", h.Topic, "queue", h.QueueID, "err", err)
		}
	}
	b.pullOnce(p, true)
	return nil, nil // answered (or parked) by pullOnce
}

func (b *Broker) checkPull(p *pullReq) *protocol.Command {
	req, h := p.rc.Request(), &p.h
	gc, ok := b.groupConfig(h.ConsumerGroup, true)
	if !ok {
		return respond(req, protocol.ResSubscriptionGroupNotExist,
			"subscription group ["+h.ConsumerGroup+"] does not exist")
	}
	if !gc.ConsumeEnable {
		return respond(req, protocol.ResNoPermission, "subscription group no permission, "+h.ConsumerGroup)
	}
	p.groupBroker, p.slowBroker = gc.BrokerID, gc.WhichBrokerWhenConsumeSlowly
	tc, ok := b.topics.get(h.Topic)
	if !ok {
		return respond(req, protocol.ResTopicNotExist, "topic["+h.Topic+"] not exist, apply first please!")
	}
	if !protocol.PermReadable(tc.Perm) {
		return respond(req, protocol.ResNoPermission, "the topic["+h.Topic+"] pulling message is forbidden")
	}
	if h.QueueID < 0 || h.QueueID >= tc.ReadQueueNums {
		return respond(req, protocol.ResInvalidParameter, "queueId is illegal for topic "+h.Topic)
	}
	var resp *protocol.Command
	if h.SysFlag&protocol.PullFlagSubscription != 0 {
		p.filter, resp = b.requestFilter(req, h) // filter.go
	} else if f := b.ext.subscription; f != nil {
		if sub, ok := f(h.ConsumerGroup, h.Topic); ok {
			if sub.SubVersion < h.SubVersion {
				return respond(req, protocol.ResSubscriptionNotLatest, "the consumer's subscription not latest")
			}
			p.filter, resp = b.registeredFilter(req, &sub) // filter.go
		} else {
			p.filter = matchAll
		}
	} else {
		p.filter = matchAll
	}
	if resp != nil {
		return resp
	}
	p.scanFrom = h.QueueOffset
	p.maxMsgs = min(max(int(h.MaxMsgNums), 1), int(b.live.pullMaxMsgs.Load()))
	p.maxBytes = int(b.live.pullMaxBytes.Load())
	if v, ok := h.MaxMsgBytes.Get(); ok && v > 0 {
		p.maxBytes = min(p.maxBytes, int(v))
	}
	p.key = queueKey{h.Topic, h.QueueID}
	return nil
}

// pullOnce looks the request up in the store and answers it, or parks it
// when allowed (first processing, SUSPEND flag) and there is nothing new.
// The offset → status mapping follows protocol §7.5.
func (b *Broker) pullOnce(p *pullReq, allowSuspend bool) {
	h := &p.h
	minOff, err := b.store.MinOffset(h.Topic, h.QueueID)
	if err != nil {
		b.answerPull(p, protocol.ResServiceNotAvailable, statusServiceShutdown, h.QueueOffset, 0, 0, nil)
		return
	}
	maxOff, err := b.store.MaxOffset(h.Topic, h.QueueID)
	if err != nil {
		b.answerPull(p, protocol.ResServiceNotAvailable, statusServiceShutdown, h.QueueOffset, 0, 0, nil)
		return
	}
	off := h.QueueOffset
	switch {
	case b.isSlave() && off > maxOff:
		// Not replicated yet (the slave is behind its master, or the
		// consumer read the master's tail before it died): the offset is
		// kept, and the pull waits for the log to get there (Java's slave
		// answers OFFSET_MOVED without moving the offset, turned into
		// RETRY_IMMEDIATELY, which makes clients spin).
		b.notFound(p, allowSuspend, statusOverflowBadly, off, minOff, maxOff)
		return
	case maxOff == 0:
		if off != 0 {
			b.answerPull(p, protocol.ResPullOffsetMoved, statusNoMessage, 0, minOff, maxOff, nil)
			return
		}
		b.notFound(p, allowSuspend, statusNoMessage, 0, minOff, maxOff)
		return
	case off < minOff:
		b.answerPull(p, protocol.ResPullOffsetMoved, statusTooSmall, minOff, minOff, maxOff, nil)
		return
	case off == maxOff:
		b.notFound(p, allowSuspend, statusOverflowOne, off, minOff, maxOff)
		return
	case off > maxOff:
		b.answerPull(p, protocol.ResPullOffsetMoved, statusOverflowBadly, maxOff, minOff, maxOff, nil)
		return
	case p.scanFrom >= maxOff && p.scanFrom > off:
		// Parked again after a filtered wake-up; nothing newer came.
		b.noneMatched(p, allowSuspend, p.scanFrom, minOff, maxOff)
		return
	}
	bp := b.getBuf()
	body := (*bp)[:0]
	taken := 0
	next, err := b.store.Get(h.Topic, h.QueueID, max(off, p.scanFrom), p.maxMsgs, p.maxBytes, func(rec []byte, code int64) bool {
		if !p.filter.match(rec, code) {
			return false
		}
		body = append(body, rec...)
		taken++
		return true
	})
	*bp = body
	defer b.putBuf(bp)
	switch {
	case err != nil:
		b.log.Error("broker: pull read failed", "topic", h.Topic, "queue", h.QueueID, "offset", off, "err", err)
		b.answerPull(p, protocol.ResSystemError, "read failed: "+err.Error(), off, minOff, maxOff, nil)
	case taken > 0:
		b.stats.pulledMsgs.Add(int64(taken)) // stats.go
		// How far the last message found is behind the log end (Java:
		// maxOffsetPy - maxPhyOffsetPulling > the memory it caches).
		if b.cfg.ha.slaveRead {
			last := lastRecordEnd(body)
			p.suggestSlave = last >= 0 && b.store.LogEnd()-last > b.cfg.ha.slaveReadLag
		}
		b.answerPull(p, protocol.ResSuccess, statusFound, next, minOff, maxOff, body)
	case next > off:
		b.noneMatched(p, allowSuspend, next, minOff, maxOff) // filter.go
	default:
		b.notFound(p, allowSuspend, statusFoundNull, off, minOff, maxOff)
	}
}

// notFound parks p (long polling) when allowed, else answers
// PULL_NOT_FOUND.
func (b *Broker) notFound(p *pullReq, allowSuspend bool, status string, next, minOff, maxOff int64) {
	if allowSuspend && p.h.SysFlag&protocol.PullFlagSuspend != 0 {
		d := min(time.Duration(p.h.SuspendTimeoutMillis)*time.Millisecond, time.Duration(b.live.maxSuspend.Load()))
		if d > 0 {
			switch b.lp.park(p, d) {
			case parked:
				return
			case parkFull:
				b.answerPull(p, protocol.ResSystemBusy, "[OVERLOAD]too many parked pulls, try again later", next, minOff, maxOff, nil)
				return
			case parkClosed:
			}
		}
	}
	b.answerPull(p, protocol.ResPullNotFound, status, next, minOff, maxOff, nil)
}

// answerPull sends the pull response; the body is copied into the frame
// before answerPull returns. It sets suggestWhichBrokerId by RocketMQ's
// rule (suggestBroker).
func (b *Broker) answerPull(p *pullReq, code int32, remark string, next, minOff, maxOff int64, body []byte) {
	suggest, code := b.suggestBroker(p, code)
	resp := protocol.NewResponse(p.rc.Request(), code, remark)
	rh := protocol.PullMessageResponseHeader{
		SuggestWhichBrokerID: suggest,
		NextBeginOffset:      next,
		MinOffset:            minOff,
		MaxOffset:            maxOff,
	}
	rh.Encode(resp)
	resp.Body = body
	// An error means the connection is gone; there is nobody to tell.
	_ = p.rc.Respond(resp)
}

// suggestBroker returns suggestWhichBrokerId and the response code of a
// pull answered with code (Java PullMessageProcessor): with slaveReadEnable
// the group's whichBrokerWhenConsumeSlowly when the pull is far behind,
// else the group's brokerId; without it the master (0). A slave whose
// master is alive sends a consumer that is not far behind back to it
// (suggests 0). Java's slave also answers such a pull that found nothing
// PULL_RETRY_IMMEDIATELY at once; runnel's holds it as any pull (long
// polling) and answers PULL_NOT_FOUND: a client whose route lacks the
// master (it was down when the client last read the route) would
// otherwise pull from the slave in a busy loop until its next route
// refresh, up to 30 s.
func (b *Broker) suggestBroker(p *pullReq, code int32) (int64, int32) {
	var suggest int64 = protocol.MasterID
	if b.cfg.ha.slaveRead {
		suggest = p.groupBroker
		if p.suggestSlave {
			suggest = p.slowBroker
		}
	}
	if b.isSlave() && !p.suggestSlave && b.slave.masterAlive() {
		suggest = protocol.MasterID
	}
	return suggest, code
}

// lastRecordEnd returns the log end after the last record of a pull body
// (its PHYSICALOFFSET plus TOTALSIZE), -1 when it holds none.
func lastRecordEnd(body []byte) int64 {
	last := -1
	for off := 0; off+protocol.RecordPhysicalOffsetPos+8 <= len(body); {
		n := int(binary.BigEndian.Uint32(body[off:]))
		if n <= 0 || off+n > len(body) {
			break
		}
		last = off
		off += n
	}
	if last < 0 {
		return -1
	}
	return int64(binary.BigEndian.Uint64(body[last+protocol.RecordPhysicalOffsetPos:])) + int64(binary.BigEndian.Uint32(body[last:]))
}
