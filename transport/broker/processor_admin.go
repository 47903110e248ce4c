package broker

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"

	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// reqUpdateBrokerConfig is UPDATE_BROKER_CONFIG (RequestCode 25).
const reqUpdateBrokerConfig int32 = 25

// maxAdminBody bounds the JSON bodies admin requests may carry.
const maxAdminBody = 1 << 20

// registerProcessors installs the core's request processors.
func (b *Broker) registerProcessors() {
	h := func(fn func(context.Context, *remoting.RequestCtx) (*protocol.Command, error), codes ...int32) {
		for _, c := range codes {
			b.srv.Handle(c, remoting.ProcessorFunc(fn))
		}
	}
	// Single-message sends run on the connection's reader goroutine
	// (processSendInline: no hand-off per request; what may block goes to
	// a broker goroutine); batches always wait for their store round.
	for _, c := range []int32{protocol.ReqSendMessage, protocol.ReqSendMessageV2,
		protocol.ReqSendReplyMessage, protocol.ReqSendReplyMessageV2} {
		b.srv.HandleInline(c, remoting.ProcessorFunc(b.processSendInline))
	}
	h(b.processSend, protocol.ReqSendBatchMessage)
	// Pulls too run on the reader goroutine: they read the store and
	// answer (or park a long poll) without waiting for anything but the
	// store's read, and the hand-off to a handler goroutine was about a
	// sixth of the CPU of draining a queue (BenchmarkClientPull). A pull
	// reading from disk delays only the later requests of its own
	// connection.
	for _, c := range []int32{protocol.ReqPullMessage, protocol.ReqLitePullMessage} {
		b.srv.HandleInline(c, remoting.ProcessorFunc(b.processPull))
	}
	h(b.processQueryConsumerOffset, protocol.ReqQueryConsumerOffset)
	h(b.processUpdateConsumerOffset, protocol.ReqUpdateConsumerOffset)
	h(b.processGetMaxOffset, protocol.ReqGetMaxOffset)
	h(b.processGetMinOffset, protocol.ReqGetMinOffset)
	h(b.processGetEarliestMsgStoreTime, protocol.ReqGetEarliestMsgStoreTime)
	h(b.processSearchOffset, protocol.ReqSearchOffsetByTimestamp)
	h(b.processViewMessage, protocol.ReqViewMessageByID)
	h(b.processQueryMessage, protocol.ReqQueryMessage)
	h(b.processCreateTopic, protocol.ReqUpdateAndCreateTopic)
	h(b.processDeleteTopic, protocol.ReqDeleteTopicInBroker)
	h(b.processGetAllTopicConfig, protocol.ReqGetAllTopicConfig)
	h(b.processGetTopicConfig, protocol.ReqGetTopicConfig)
	h(b.processGetAllGroups, protocol.ReqGetAllSubscriptionGroupConfig)
	h(b.processCreateGroup, protocol.ReqUpdateAndCreateSubscriptionGroup)
	h(b.processDeleteGroup, protocol.ReqDeleteSubscriptionGroup)
	h(b.processTopicStats, protocol.ReqGetTopicStatsInfo)
	h(b.processConsumeStats, protocol.ReqGetConsumeStats)
	// END_TRANSACTION too runs on the reader goroutine when it needs
	// nothing that blocks (transaction.go, processEndInline).
	b.srv.HandleInline(protocol.ReqEndTransaction, remoting.ProcessorFunc(b.tx.processEndInline))
	// Remote config writes are a known remote-code-execution vector
	// (CVE-2023-33246): only an allow-list of harmless keys (processor_config.go).
	h(b.processUpdateBrokerConfig, reqUpdateBrokerConfig)
	h(b.processGetBrokerConfig, reqGetBrokerConfig)
	// Replication (ha.go, ha_sync.go).
	h(b.processHAStatus, protocol.ReqGetBrokerHAStatus)
	h(b.processGetAllConsumerOffset, protocol.ReqGetAllConsumerOffset)
	h(b.processGetAllDelayOffset, protocol.ReqGetAllDelayOffset)
}

// processCreateTopic serves UPDATE_AND_CREATE_TOPIC (17): create or
// replace a topic config, persist it and register it with the name
// servers at once.
func (b *Broker) processCreateTopic(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var h protocol.CreateTopicRequestHeader
	if err := h.Decode(req); err != nil {
		return respond(req, protocol.ResInvalidParameter, err.Error()), nil
	}
	if err := validateTopic(h.Topic); err != nil {
		return respond(req, protocol.ResInvalidParameter, err.Error()), nil
	}
	if b.isSystemTopic(h.Topic) {
		return respond(req, protocol.ResInvalidParameter, "The topic["+h.Topic+"] is conflict with system topic."), nil
	}
	if h.ReadQueueNums < 1 || h.ReadQueueNums > MaxQueueNums || h.WriteQueueNums < 1 || h.WriteQueueNums > MaxQueueNums {
		return respond(req, protocol.ResInvalidParameter, "queue nums must be in [1, "+strconv.Itoa(MaxQueueNums)+"]"), nil
	}
	if !protocol.PermValid(h.Perm) {
		return respond(req, protocol.ResInvalidParameter, "invalid perm "+strconv.Itoa(int(h.Perm))), nil
	}
	filter := h.TopicFilterType
	switch filter {
	case "":
		filter = protocol.TopicFilterSingleTag
	case protocol.TopicFilterSingleTag, protocol.TopicFilterMultiTag:
	default:
		return respond(req, protocol.ResInvalidParameter, "invalid topicFilterType "+filter), nil
	}
	tc := TopicConfig{
		TopicName: h.Topic, ReadQueueNums: h.ReadQueueNums, WriteQueueNums: h.WriteQueueNums,
		Perm: h.Perm, TopicFilterType: filter, TopicSysFlag: h.TopicSysFlag.Or(0), Order: h.Order,
		Attributes: parseAttributes(h.Attributes),
	}
	if err := b.putTopic(tc, true); err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	return respond(req, protocol.ResSuccess, ""), nil
}

// parseAttributes parses "+k=v,+k2=v2" (attributes to set; "-k" entries,
// which delete, are ignored for a full replace).
func parseAttributes(s string) map[string]string {
	m := map[string]string{}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if !strings.HasPrefix(part, "+") {
			continue
		}
		if k, v, ok := strings.Cut(part[1:], "="); ok && k != "" {
			m[k] = v
		}
	}
	return m
}

// processDeleteTopic serves DELETE_TOPIC_IN_BROKER (215): the topic's
// config, messages and consumer offsets are removed.
func (b *Broker) processDeleteTopic(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var h protocol.DeleteTopicRequestHeader
	if err := h.Decode(req); err != nil {
		return respond(req, protocol.ResInvalidParameter, err.Error()), nil
	}
	if err := validateTopic(h.Topic); err != nil {
		return respond(req, protocol.ResInvalidParameter, err.Error()), nil
	}
	if b.isSystemTopic(h.Topic) {
		return respond(req, protocol.ResInvalidParameter, "The topic["+h.Topic+"] is a system topic and cannot be deleted."), nil
	}
	if err := b.deleteTopic(h.Topic); err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	return respond(req, protocol.ResSuccess, ""), nil
}

// processGetAllTopicConfig serves GET_ALL_TOPIC_CONFIG (21).
func (b *Broker) processGetAllTopicConfig(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	table, version := b.topics.snapshot()
	w := protocol.TopicConfigSerializeWrapper{DataVersion: version, TopicConfigTable: table}
	body, err := w.Encode()
	if err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	resp := respond(req, protocol.ResSuccess, "")
	rh := protocol.GetAllTopicConfigResponseHeader{TotalTopicNum: protocol.Some(int32(len(table)))}
	rh.Encode(resp)
	resp.Body = body
	return resp, nil
}

// processGetTopicConfig serves GET_TOPIC_CONFIG (351): one topic's config
// as JSON, TOPIC_NOT_EXIST when unknown.
func (b *Broker) processGetTopicConfig(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var h protocol.GetTopicConfigRequestHeader
	if err := h.Decode(req); err != nil {
		return respond(req, protocol.ResInvalidParameter, err.Error()), nil
	}
	tc, ok := b.topics.get(h.Topic)
	if !ok {
		return respond(req, protocol.ResTopicNotExist, "No topic in this broker. topic: "+h.Topic), nil
	}
	body, err := json.Marshal(tc)
	if err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	resp := respond(req, protocol.ResSuccess, "")
	resp.Body = body
	return resp, nil
}

// processGetAllGroups serves GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201).
func (b *Broker) processGetAllGroups(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	w := protocol.SubscriptionGroupWrapper{
		DataVersion:            protocol.DataVersion{Timestamp: b.startedAt.UnixMilli()},
		SubscriptionGroupTable: *b.groups.m.Load(),
	}
	body, err := w.Encode()
	if err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	resp := respond(req, protocol.ResSuccess, "")
	resp.Body = body
	return resp, nil
}

// processCreateGroup serves UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200): the
// body is a SubscriptionGroupConfig JSON.
func (b *Broker) processCreateGroup(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	if len(req.Body) == 0 || len(req.Body) > maxAdminBody {
		return respond(req, protocol.ResInvalidParameter, "subscription group config body missing or too large"), nil
	}
	norm, err := protocol.NormalizeJSON(nil, req.Body)
	if err != nil {
		return respond(req, protocol.ResInvalidParameter, err.Error()), nil
	}
	gc := protocol.DefaultSubscriptionGroupConfig("")
	if err := json.Unmarshal(norm, &gc); err != nil {
		return respond(req, protocol.ResInvalidParameter, "bad subscription group config: "+err.Error()), nil
	}
	if err := validateName(gc.GroupName, maxRetryTopicLen); err != nil {
		return respond(req, protocol.ResInvalidParameter, "group: "+err.Error()), nil
	}
	if err := b.putGroup(gc, false); err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	return respond(req, protocol.ResSuccess, ""), nil
}

// processDeleteGroup serves DELETE_SUBSCRIPTIONGROUP (207); the group's
// consumer offsets go with it.
func (b *Broker) processDeleteGroup(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var h protocol.DeleteSubscriptionGroupRequestHeader
	if err := h.Decode(req); err != nil {
		return respond(req, protocol.ResInvalidParameter, err.Error()), nil
	}
	if err := validateName(h.GroupName, maxRetryTopicLen); err != nil {
		return respond(req, protocol.ResInvalidParameter, "group: "+err.Error()), nil
	}
	if err := b.deleteGroup(h.GroupName); err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	return respond(req, protocol.ResSuccess, ""), nil
}

// processTopicStats serves GET_TOPIC_STATS_INFO (202): per queue min and
// max offsets and the last store time, as TopicStatsTable JSON (fastjson's
// object-key form, which Java admin tools read).
func (b *Broker) processTopicStats(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var h protocol.GetTopicStatsInfoRequestHeader
	if err := h.Decode(req); err != nil {
		return respond(req, protocol.ResInvalidParameter, err.Error()), nil
	}
	tc, ok := b.topics.get(h.Topic)
	if !ok {
		return respond(req, protocol.ResTopicNotExist, "topic["+h.Topic+"] not exist"), nil
	}
	body := []byte(`{"offsetTable":{`)
	for q := range tc.WriteQueueNums {
		minOff, err1 := b.store.MinOffset(h.Topic, q)
		maxOff, err2 := b.store.MaxOffset(h.Topic, q)
		if err := errors.Join(err1, err2); err != nil {
			return offsetStoreError(req, err), nil
		}
		last := b.lastStoreTime(h.Topic, q, maxOff)
		if q > 0 {
			body = append(body, ',')
		}
		// Names are validated ([%|a-zA-Z0-9_-]): no JSON escaping needed.
		body = append(body, `{"brokerName":"`...)
		body = append(body, b.cfg.brokerName...)
		body = append(body, `","queueId":`...)
		body = strconv.AppendInt(body, int64(q), 10)
		body = append(body, `,"topic":"`...)
		body = append(body, h.Topic...)
		body = append(body, `"}:{"lastUpdateTimestamp":`...)
		body = strconv.AppendInt(body, last, 10)
		body = append(body, `,"maxOffset":`...)
		body = strconv.AppendInt(body, maxOff, 10)
		body = append(body, `,"minOffset":`...)
		body = strconv.AppendInt(body, minOff, 10)
		body = append(body, '}')
	}
	body = append(body, "}}"...)
	resp := respond(req, protocol.ResSuccess, "")
	resp.Body = body
	return resp, nil
}

// lastStoreTime returns the store time of the queue's message before
// offset end (the queue's last message for its max offset), 0 if none.
func (b *Broker) lastStoreTime(topic string, q int32, end int64) int64 {
	if end <= 0 {
		return 0
	}
	var ts int64
	_, err := b.store.Get(topic, q, end-1, 1, 0, func(rec []byte, _ int64) bool {
		if m, _, err := protocol.DecodeRecord(rec); err == nil {
			ts = m.StoreTimestamp
		}
		return true
	})
	if err != nil {
		return 0
	}
	return ts
}

// processConsumeStats serves GET_CONSUME_STATS (208): per queue of the
// topic (or of every topic the group has offsets in), the broker's max
// offset, the group's committed offset (-1 when it committed none, where
// Java answers 0) and the store time of the last message it consumed.
func (b *Broker) processConsumeStats(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var h protocol.GetConsumeStatsRequestHeader
	if err := h.Decode(req); err != nil {
		return respond(req, protocol.ResInvalidParameter, err.Error()), nil
	}
	var topics []string
	switch {
	case h.Topic != "":
		topics = []string{h.Topic}
	case h.TopicList != "":
		topics = strings.Split(h.TopicList, ";")
	default:
		table, _ := b.topics.snapshot()
		for name := range table {
			topics = append(topics, name)
		}
		slices.Sort(topics)
	}
	stats := protocol.ConsumeStats{OffsetTable: map[protocol.MessageQueue]protocol.OffsetWrapper{}}
	for _, t := range topics {
		tc, ok := b.topics.get(t)
		if !ok {
			continue
		}
		offs, err := b.store.ConsumerOffsets(h.ConsumerGroup, t)
		if err != nil {
			return offsetStoreError(req, err), nil
		}
		if len(offs) == 0 && h.Topic == "" {
			continue
		}
		for q := range tc.WriteQueueNums {
			maxOff, err := b.store.MaxOffset(t, q)
			if err != nil {
				return offsetStoreError(req, err), nil
			}
			co, ok := offs[q]
			if !ok {
				co = -1
			}
			// LastTimestamp is the store time of the last message the
			// group consumed (Java: of the message at consumerOffset-1),
			// which mqadmin consumerProgress shows as #LastTime.
			stats.OffsetTable[protocol.MessageQueue{BrokerName: b.cfg.brokerName, QueueID: q, Topic: t}] =
				protocol.OffsetWrapper{BrokerOffset: maxOff, ConsumerOffset: co, PullOffset: max(co, 0),
					LastTimestamp: b.lastStoreTime(t, q, co)}
		}
	}
	body, err := stats.Encode()
	if err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	resp := respond(req, protocol.ResSuccess, "")
	resp.Body = body
	return resp, nil
}
