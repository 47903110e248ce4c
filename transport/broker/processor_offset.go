package broker

import (
	"context"
	"errors"
	"strconv"
	"strings"

	"github.com/runnel-dev/runnel/transport/broker/internal/store"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// processQueryConsumerOffset serves QUERY_CONSUMER_OFFSET (14): the
// committed offset; without one, 0 for a "young" queue (its min offset is
// 0 and it holds messages: a new group starts from the beginning, as Java
// does while offset 0 is in memory) unless setZeroIfNotFound is false, and
// QUERY_NOT_FOUND otherwise.
func (b *Broker) processQueryConsumerOffset(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var h protocol.QueryConsumerOffsetRequestHeader
	if err := h.Decode(req); err != nil {
		return respond(req, protocol.ResInvalidParameter, err.Error()), nil
	}
	off, ok, err := b.store.QueryOffset(h.ConsumerGroup, h.Topic, h.QueueID)
	if err != nil {
		return offsetStoreError(req, err), nil
	}
	if !ok {
		if v, set := h.SetZeroIfNotFound.Get(); set && !v {
			return respond(req, protocol.ResQueryNotFound, "Not found, the consumer group has no committed offset"), nil
		}
		minOff, err1 := b.store.MinOffset(h.Topic, h.QueueID)
		maxOff, err2 := b.store.MaxOffset(h.Topic, h.QueueID)
		if err := errors.Join(err1, err2); err != nil {
			return offsetStoreError(req, err), nil
		}
		if minOff > 0 || maxOff == 0 {
			return respond(req, protocol.ResQueryNotFound, "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first"), nil
		}
		off = 0
	}
	resp := respond(req, protocol.ResSuccess, "")
	rh := protocol.QueryConsumerOffsetResponseHeader{Offset: off}
	rh.Encode(resp)
	return resp, nil
}

// offsetStoreError answers a store failure of an offset request.
func offsetStoreError(req *protocol.Command, err error) *protocol.Command {
	if errors.Is(err, store.ErrInvalid) {
		return respond(req, protocol.ResInvalidParameter, err.Error())
	}
	return errorResponse(req, storeError(err))
}

// processUpdateConsumerOffset serves UPDATE_CONSUMER_OFFSET (15). It is
// idempotent and cheap (an unsynced Pebble write); the Go client sends it
// every 5 s per owned queue, changed or not.
func (b *Broker) processUpdateConsumerOffset(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var h protocol.UpdateConsumerOffsetRequestHeader
	if err := h.Decode(req); err != nil {
		return respond(req, protocol.ResInvalidParameter, err.Error()), nil
	}
	if _, ok := b.groupConfig(h.ConsumerGroup, true); !ok {
		return respond(req, protocol.ResSubscriptionGroupNotExist, "subscription group ["+h.ConsumerGroup+"] does not exist"), nil
	}
	tc, ok := b.topics.get(h.Topic)
	if !ok {
		return respond(req, protocol.ResTopicNotExist, "topic["+h.Topic+"] not exist"), nil
	}
	if h.QueueID < 0 || h.QueueID >= queueCount(tc) || h.CommitOffset < 0 {
		return respond(req, protocol.ResInvalidParameter, "illegal queueId or offset"), nil
	}
	if err := b.store.CommitOffset(h.ConsumerGroup, h.Topic, h.QueueID, h.CommitOffset); err != nil {
		return offsetStoreError(req, err), nil
	}
	return respond(req, protocol.ResSuccess, ""), nil
}

// offsetResponse answers with extField "offset" (clients parse it without
// checking the code, gotcha 33).
func offsetResponse(req *protocol.Command, off int64) *protocol.Command {
	resp := respond(req, protocol.ResSuccess, "")
	resp.SetExtInt("offset", off)
	return resp
}

// processGetMaxOffset serves GET_MAX_OFFSET (30): the next offset to be
// written (0 for an unknown queue).
func (b *Broker) processGetMaxOffset(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var h protocol.GetMaxOffsetRequestHeader
	if err := h.Decode(req); err != nil {
		return respond(req, protocol.ResInvalidParameter, err.Error()), nil
	}
	off, err := b.store.MaxOffset(h.Topic, h.QueueID)
	if err != nil {
		return offsetStoreError(req, err), nil
	}
	return offsetResponse(req, off), nil
}

// processGetMinOffset serves GET_MIN_OFFSET (31).
func (b *Broker) processGetMinOffset(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var h protocol.GetMinOffsetRequestHeader
	if err := h.Decode(req); err != nil {
		return respond(req, protocol.ResInvalidParameter, err.Error()), nil
	}
	off, err := b.store.MinOffset(h.Topic, h.QueueID)
	if err != nil {
		return offsetStoreError(req, err), nil
	}
	return offsetResponse(req, off), nil
}

// processGetEarliestMsgStoreTime serves GET_EARLIEST_MSG_STORETIME (32):
// the store time of the oldest message, -1 for an empty queue (as Java).
func (b *Broker) processGetEarliestMsgStoreTime(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var h protocol.GetEarliestMsgStoretimeRequestHeader
	if err := h.Decode(req); err != nil {
		return respond(req, protocol.ResInvalidParameter, err.Error()), nil
	}
	ts, err := b.store.EarliestStoreTime(h.Topic, h.QueueID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		ts = -1
	case err != nil:
		return offsetStoreError(req, err), nil
	}
	resp := respond(req, protocol.ResSuccess, "")
	rh := protocol.GetEarliestMsgStoretimeResponseHeader{Timestamp: ts}
	rh.Encode(resp)
	return resp, nil
}

// processSearchOffset serves SEARCH_OFFSET_BY_TIMESTAMP (29): lower
// boundary (default) = first offset stored at or after the timestamp;
// "upper" = last offset stored at or before it.
func (b *Broker) processSearchOffset(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var h protocol.SearchOffsetRequestHeader
	if err := h.Decode(req); err != nil {
		return respond(req, protocol.ResInvalidParameter, err.Error()), nil
	}
	upper := strings.EqualFold(h.BoundaryType, "upper")
	off, err := b.store.SearchOffset(h.Topic, h.QueueID, h.Timestamp, upper)
	if err != nil {
		return offsetStoreError(req, err), nil
	}
	return offsetResponse(req, off), nil
}

// processViewMessage serves VIEW_MESSAGE_BY_ID (33): the record at a
// commit-log offset (decoded from an offset message id by the client).
func (b *Broker) processViewMessage(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var h protocol.ViewMessageRequestHeader
	if err := h.Decode(req); err != nil {
		return respond(req, protocol.ResInvalidParameter, err.Error()), nil
	}
	rec, err := b.store.GetByPhysicalOffset(h.Offset)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return respond(req, protocol.ResSystemError, "can not find message by the offset, "+strconv.FormatInt(h.Offset, 10)), nil
		}
		return offsetStoreError(req, err), nil
	}
	resp := respond(req, protocol.ResSuccess, "")
	resp.Body = rec
	return resp, nil
}

// maxQueryBody bounds a QUERY_MESSAGE response body.
const maxQueryBody = 16 << 20

// processQueryMessage serves QUERY_MESSAGE (12): messages of a topic
// indexed under a KEYS value or (with _UNIQUE_KEY_QUERY) a UNIQ_KEY,
// stored in [beginTimestamp, endTimestamp], newest first; QUERY_NOT_FOUND
// when there are none.
func (b *Broker) processQueryMessage(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var h protocol.QueryMessageRequestHeader
	if err := h.Decode(req); err != nil {
		return respond(req, protocol.ResInvalidParameter, err.Error()), nil
	}
	maxNum := int(h.MaxNum)
	if h.UniqueKeyQuery.Or(false) {
		maxNum = max(maxNum, 32) // every copy of a UNIQ_KEY (resends, retries)
	}
	recs, err := b.store.QueryByKey(h.Topic, h.Key, maxNum, h.BeginTimestamp, h.EndTimestamp)
	if err != nil {
		return offsetStoreError(req, err), nil
	}
	if len(recs) == 0 {
		return respond(req, protocol.ResQueryNotFound, "can not find message, maybe time range not correct"), nil
	}
	var body []byte
	var lastTS, lastPhys int64
	for _, rec := range recs {
		if len(body)+len(rec) > maxQueryBody && len(body) > 0 {
			break
		}
		if m, _, err := protocol.DecodeRecord(rec); err == nil {
			lastTS = max(lastTS, m.StoreTimestamp)
			lastPhys = max(lastPhys, m.CommitLogOffset)
		}
		body = append(body, rec...)
	}
	resp := respond(req, protocol.ResSuccess, "")
	rh := protocol.QueryMessageResponseHeader{IndexLastUpdateTimestamp: lastTS, IndexLastUpdatePhyOffset: lastPhys}
	rh.Encode(resp)
	resp.Body = body
	return resp, nil
}
