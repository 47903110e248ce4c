package broker

import (
	"context"
	"encoding/json"
	"slices"
	"strings"

	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// Broker-side load balancing (Java QueryAssignmentProcessor): a 5.x Java
// push consumer with clientRebalance=false asks a broker of each topic for
// its queues (QUERY_ASSIGNMENT) and how to consume them: PULL, or POP
// (queue id -1 = pop every queue, with popShareQueueNum -1). The mode of a
// group on a topic is set by SET_MESSAGE_REQUEST_MODE (mqadmin
// setConsumeMode), kept durably, else WithDefaultMessageRequestMode.
//
// The queues assigned are this broker's queues of the topic: in a cluster
// of several brokers each one assigns its own (a Java broker assigns the
// route's queues of every broker).

const modePrefix = "pop/mode/"

func modeKey(tg topicGroup) []byte { return []byte(modePrefix + tg.topic + "\x00" + tg.group) }

// loadModes reads the stored request modes (with mu held, from
// ensureLoaded).
func (p *popService) loadModesLocked() error {
	return p.b.store.ScanMeta([]byte(modePrefix), func(k, v []byte) bool {
		var body protocol.SetMessageRequestModeRequestBody
		if err := json.Unmarshal(v, &body); err != nil {
			p.b.log.Error("broker: stored message request mode skipped", "key", string(k), "err", err)
			return true
		}
		p.mu.modes[topicGroup{body.Topic, body.ConsumerGroup}] = body
		return true
	})
}

func (p *popService) processSetRequestMode(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var body protocol.SetMessageRequestModeRequestBody
	if err := body.Decode(req.Body); err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	if strings.HasPrefix(body.Topic, retryPrefix) {
		return respond(req, protocol.ResNoPermission, "retry topic is not allowed to set mode"), nil
	}
	if _, ok := p.b.topics.get(body.Topic); !ok {
		return respond(req, protocol.ResTopicNotExist, "topic["+body.Topic+"] not exist"), nil
	}
	if _, ok := p.b.groupConfig(body.ConsumerGroup, false); !ok {
		return respond(req, protocol.ResSubscriptionGroupNotExist, "subscription group does not exist"), nil
	}
	if body.Mode != protocol.RequestModePull && body.Mode != protocol.RequestModePop {
		return respond(req, protocol.ResInvalidParameter, "unknown message request mode "+body.Mode), nil
	}
	if err := p.ensureLoaded(); err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	v, err := json.Marshal(&body) // admin path
	if err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	tg := topicGroup{body.Topic, body.ConsumerGroup}
	if err := p.b.store.PutMeta(modeKey(tg), v); err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	p.mu.Lock()
	p.mu.modes[tg] = body
	p.mu.Unlock()
	return respond(req, protocol.ResSuccess, ""), nil
}

func (p *popService) processQueryAssignment(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var body protocol.QueryAssignmentRequestBody
	if err := body.Decode(req.Body); err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	if err := p.ensureLoaded(); err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	p.mu.Lock()
	mode, ok := p.mu.modes[topicGroup{body.Topic, body.ConsumerGroup}]
	p.mu.Unlock()
	if !ok {
		mode = protocol.SetMessageRequestModeRequestBody{Topic: body.Topic, ConsumerGroup: body.ConsumerGroup, Mode: protocol.RequestModePull}
		if !strings.HasPrefix(body.Topic, retryPrefix) {
			mode.Mode = p.cfg.defaultMode
			if mode.Mode == protocol.RequestModePop {
				mode.PopShareQueueNum = p.cfg.defaultShare
			}
		}
	}
	var out protocol.QueryAssignmentResponseBody
	qs := p.assign(&body, &mode)
	slices.SortFunc(qs, protocol.MessageQueue.Compare)
	for _, q := range slices.Compact(qs) { // Java returns a set
		out.MessageQueueAssignments = append(out.MessageQueueAssignments, protocol.MessageQueueAssignment{MessageQueue: q, Mode: mode.Mode})
	}
	b, err := out.Encode()
	if err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	resp := respond(req, protocol.ResSuccess, "")
	resp.Body = b
	return resp, nil
}

// assign is Java's doLoadBalance over this broker's queues of the topic.
func (p *popService) assign(body *protocol.QueryAssignmentRequestBody, mode *protocol.SetMessageRequestModeRequestBody) []protocol.MessageQueue {
	tc, ok := p.b.topics.get(body.Topic)
	if !ok {
		return nil
	}
	mqs := make([]protocol.MessageQueue, tc.ReadQueueNums)
	for i := range mqs {
		mqs[i] = protocol.MessageQueue{Topic: body.Topic, BrokerName: p.b.cfg.brokerName, QueueID: int32(i)}
	}
	if body.MessageModel == protocol.MessageModelBroadcasting {
		return mqs
	}
	var cids []string
	if p.clients != nil {
		cids = p.clients.consumerIDs(body.ConsumerGroup)
	}
	if len(cids) == 0 {
		return nil
	}
	slices.Sort(cids)
	alloc := allocateStrategy(body.StrategyName)
	if alloc == nil {
		p.b.log.Warn("broker: QUERY_ASSIGNMENT with an unsupported strategy", "strategy", body.StrategyName)
		return nil
	}
	if mode.Mode == protocol.RequestModePop {
		return allocate4Pop(alloc, body.ClientID, mqs, cids, int(mode.PopShareQueueNum))
	}
	return alloc(body.ClientID, mqs, cids)
}

type allocator func(self string, mqs []protocol.MessageQueue, cids []string) []protocol.MessageQueue

// allocateStrategy returns Java's strategy of that name (AVG,
// AVG_BY_CIRCLE), nil for others.
func allocateStrategy(name string) allocator {
	switch name {
	case "AVG", "":
		return allocateAveragely
	case "AVG_BY_CIRCLE":
		return allocateByCircle
	}
	return nil
}

// allocateAveragely is AllocateMessageQueueAveragely: contiguous blocks, the
// first len(mqs)%len(cids) clients one more.
func allocateAveragely(self string, mqs []protocol.MessageQueue, cids []string) []protocol.MessageQueue {
	idx := slices.Index(cids, self)
	if idx < 0 || len(mqs) == 0 {
		return nil
	}
	n, c := len(mqs), len(cids)
	mod := n % c
	size := 1
	if n > c {
		size = n / c
		if mod > 0 && idx < mod {
			size++
		}
	}
	start := idx*size + mod
	if mod > 0 && idx < mod {
		start = idx * size
	}
	rng := min(size, n-start)
	var out []protocol.MessageQueue
	for i := 0; i < rng; i++ {
		out = append(out, mqs[(start+i)%n])
	}
	return out
}

// allocateByCircle is AllocateMessageQueueAveragelyByCircle.
func allocateByCircle(self string, mqs []protocol.MessageQueue, cids []string) []protocol.MessageQueue {
	idx := slices.Index(cids, self)
	if idx < 0 {
		return nil
	}
	var out []protocol.MessageQueue
	for i := idx; i < len(mqs); i += len(cids) {
		out = append(out, mqs[i])
	}
	return out
}

// allocate4Pop is QueryAssignmentProcessor.allocate4Pop.
func allocate4Pop(alloc allocator, self string, mqs []protocol.MessageQueue, cids []string, share int) []protocol.MessageQueue {
	if share <= 0 || share >= len(cids)-1 {
		out := make([]protocol.MessageQueue, len(mqs))
		for i, q := range mqs {
			out[i] = protocol.MessageQueue{Topic: q.Topic, BrokerName: q.BrokerName, QueueID: -1}
		}
		return out
	}
	if len(cids) <= len(mqs) {
		out := alloc(self, mqs, cids)
		idx := slices.Index(cids, self)
		if idx >= 0 {
			for range share {
				idx = (idx + 1) % len(cids)
				out = append(out, alloc(cids[idx], mqs, cids)...)
			}
		}
		return out
	}
	// More clients than queues: each client gets one queue, round robin
	// (Java's allocate).
	idx := slices.Index(cids, self)
	if idx < 0 {
		return nil
	}
	return []protocol.MessageQueue{mqs[idx%len(mqs)]}
}
