package watermill

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// Properties the DefaultMarshaler writes besides the metadata. They are
// reserved: metadata may not use these names.
const (
	// UUIDProperty carries the watermill message UUID. The UUID is also the
	// message's RocketMQ key (KEYS) when it is a valid key (no spaces), so
	// that QUERY_MESSAGE by key finds it.
	UUIDProperty = "_watermill_message_uuid"
	// EmptyPayloadProperty is "1" on a message whose watermill payload was
	// empty: RocketMQ refuses empty bodies, so such a message is sent with a
	// one-byte body that the Unmarshaler drops.
	EmptyPayloadProperty = "_watermill_empty_payload"
	// EmptyMetadataProperty lists the metadata keys whose value is empty,
	// separated by NUL bytes: RocketMQ drops properties with empty values.
	EmptyMetadataProperty = "_watermill_empty_metadata"
)

// ErrInvalidMetadata is wrapped by Marshal errors for metadata that cannot be
// carried as RocketMQ user properties: a reserved name (see IsReservedProperty),
// an empty key, or a key or value holding a property separator byte (0x01,
// 0x02) or, for an empty value, a NUL byte in the key.
var ErrInvalidMetadata = errors.New("watermill: invalid metadata")

// Marshaler turns a watermill message into the RocketMQ message Publish sends
// to topic. It must be safe for concurrent use. The returned message must not
// alias msg.Payload if msg may be modified while it is sent (Publish sends
// synchronously, so aliasing is fine for the DefaultMarshaler).
type Marshaler interface {
	Marshal(topic string, msg *message.Message) (*client.Message, error)
}

// Unmarshaler turns a pulled RocketMQ message into a watermill message. ext
// aliases the pull response and is valid only during the call: the result
// must not keep references into it (copy bodies and strings). It must be safe
// for concurrent use. An error skips the message (see SubscriberConfig).
type Unmarshaler interface {
	Unmarshal(ext *protocol.MessageExt) (*message.Message, error)
}

// MarshalerUnmarshaler is both.
type MarshalerUnmarshaler interface {
	Marshaler
	Unmarshaler
}

// DefaultMarshaler maps a watermill message onto a RocketMQ message:
//
//   - Payload ↔ body (an empty payload is sent as a 1-byte body flagged by
//     EmptyPayloadProperty, since RocketMQ refuses empty bodies).
//   - UUID ↔ UUIDProperty, and the message key (KEYS) when the UUID has no
//     spaces. A message without UUIDProperty (sent by another RocketMQ
//     client) gets its UNIQ_KEY (the client message id) as UUID.
//   - Metadata ↔ user properties, name for name. Names RocketMQ or this
//     package reserve (IsReservedProperty) are refused, not escaped, so a
//     property never means two things; empty values travel in
//     EmptyMetadataProperty. On receipt every property that is not reserved
//     becomes metadata.
//
// Tag, when set, gives the RocketMQ tag (TAGS) of each message, which
// subscribers of other clients can filter on. The zero value is ready to use.
type DefaultMarshaler struct {
	// Tag returns the tag of msg sent to topic; nil or "" = no tag.
	Tag func(topic string, msg *message.Message) string
}

var _ MarshalerUnmarshaler = DefaultMarshaler{}

// Marshal implements Marshaler.
func (m DefaultMarshaler) Marshal(topic string, msg *message.Message) (*client.Message, error) {
	props := make(map[string]string, len(msg.Metadata)+1)
	var empty []byte
	for k, v := range msg.Metadata {
		if err := checkMetadata(k, v); err != nil {
			return nil, err
		}
		if v == "" {
			if len(empty) > 0 {
				empty = append(empty, 0)
			}
			empty = append(empty, k...)
			continue
		}
		props[k] = v
	}
	if len(empty) > 0 {
		props[EmptyMetadataProperty] = string(empty)
	}
	out := &client.Message{Topic: topic, Body: msg.Payload, Properties: props}
	if msg.UUID != "" {
		if strings.ContainsAny(msg.UUID, "\x01\x02") {
			return nil, fmt.Errorf("%w: UUID %q holds a property separator byte", ErrInvalidMetadata, msg.UUID)
		}
		props[UUIDProperty] = msg.UUID
		if !strings.ContainsAny(msg.UUID, " \t\n") {
			out.Keys = []string{msg.UUID}
		}
	}
	if len(out.Body) == 0 {
		out.Body = emptyBody
		props[EmptyPayloadProperty] = "1"
	}
	if m.Tag != nil {
		out.Tags = m.Tag(topic, msg)
	}
	return out, nil
}

// emptyBody is the body sent for an empty payload. It is never modified.
var emptyBody = []byte{0}

func checkMetadata(k, v string) error {
	switch {
	case k == "":
		return fmt.Errorf("%w: empty key", ErrInvalidMetadata)
	case IsReservedProperty(k):
		return fmt.Errorf("%w: key %q is a reserved RocketMQ or watermill property name", ErrInvalidMetadata, k)
	case strings.ContainsAny(k, "\x01\x02") || strings.ContainsAny(v, "\x01\x02"):
		return fmt.Errorf("%w: key %q: key or value holds a property separator byte", ErrInvalidMetadata, k)
	case v == "" && strings.IndexByte(k, 0) >= 0:
		return fmt.Errorf("%w: key %q with an empty value holds a NUL byte", ErrInvalidMetadata, k)
	}
	return nil
}

// Unmarshal implements Unmarshaler. It never fails: every message pulled
// becomes a watermill message.
func (DefaultMarshaler) Unmarshal(ext *protocol.MessageExt) (*message.Message, error) {
	md := make(message.Metadata, 4)
	var uuid, empty string
	emptyPayload := false
	protocol.RangeProperties(ext.Properties, func(n, v string) bool {
		switch n {
		case UUIDProperty:
			uuid = v
		case EmptyPayloadProperty:
			emptyPayload = true
		case EmptyMetadataProperty:
			empty = v
		default:
			if !IsReservedProperty(n) {
				md[strings.Clone(n)] = strings.Clone(v)
			}
		}
		return true
	})
	for k := range strings.SplitSeq(empty, "\x00") {
		if k != "" {
			md[strings.Clone(k)] = ""
		}
	}
	if uuid == "" {
		uuid = ext.UniqKey()
	}
	var payload []byte
	if !emptyPayload {
		payload = append(make([]byte, 0, len(ext.Body)), ext.Body...)
	}
	msg := message.NewMessage(strings.Clone(uuid), payload)
	msg.Metadata = md
	return msg, nil
}

// reservedProperties are the property names of RocketMQ (Java MessageConst,
// including the Go client's SHARDING_KEY) and of this package. Metadata may
// not use them and received properties with these names are not metadata.
var reservedProperties = func() map[string]struct{} {
	names := []string{
		protocol.PropKeys, protocol.PropTags, protocol.PropWaitStoreMsgOK, protocol.PropDelayLevel,
		protocol.PropRetryTopic, protocol.PropRealTopic, protocol.PropRealQueueID,
		protocol.PropTransactionPrepared, protocol.PropProducerGroup, protocol.PropMinOffset,
		protocol.PropMaxOffset, protocol.PropBuyerID, protocol.PropOriginMessageID,
		protocol.PropTransferFlag, protocol.PropCorrectionFlag, protocol.PropReconsumeTime,
		protocol.PropMsgRegion, protocol.PropTraceSwitch, protocol.PropUniqKey,
		protocol.PropExtendUniqInfo, protocol.PropMaxReconsumeTimes, protocol.PropConsumeStartTime,
		protocol.PropInnerNum, protocol.PropInnerBase, protocol.PropDupInfo,
		protocol.PropCheckImmunityTime, protocol.PropTransactionPreparedQueue,
		protocol.PropTransactionID, protocol.PropTransactionCheckTimes, protocol.PropInstanceID,
		protocol.PropCorrelationID, protocol.PropReplyToClient, protocol.PropTTL,
		protocol.PropArriveTime, protocol.PropPushReplyTime, protocol.PropCluster,
		protocol.PropMsgType, protocol.PropPopCK, protocol.PropPopCKOffset, protocol.PropFirstPopTime,
		protocol.PropShardingKey, protocol.PropShardingKeyJava, protocol.PropTimerDeliverMS,
		protocol.PropTimerDelaySec, protocol.PropTimerDelayMS, protocol.PropTimerEnqueueMS,
		protocol.PropTimerDequeueMS, protocol.PropTimerRollTimes, protocol.PropTimerOutMS,
		protocol.PropTimerDelUniqKey, protocol.PropTimerDelayLevel, protocol.PropStartDeliverTime,
		protocol.PropBornHost, protocol.PropBornTimestamp, protocol.PropDLQOriginTopic,
		protocol.PropDLQOriginMessageID, protocol.PropInnerMultiDispatch,
		protocol.PropInnerMultiQueueOffset,
		UUIDProperty, EmptyPayloadProperty, EmptyMetadataProperty,
	}
	m := make(map[string]struct{}, len(names))
	for _, n := range names {
		m[n] = struct{}{}
	}
	return m
}()

// IsReservedProperty reports whether name is a property name RocketMQ or
// this package gives a meaning (TAGS, KEYS, UNIQ_KEY, DELAY, RETRY_TOPIC, …,
// any "__RMQ.TRANSIENT." name, UUIDProperty, …). Such names cannot be
// metadata keys. Names are case-sensitive, as in RocketMQ.
func IsReservedProperty(name string) bool {
	if _, ok := reservedProperties[name]; ok {
		return true
	}
	return strings.HasPrefix(name, protocol.PropTransientPrefix)
}

// ShardingKeyFromMetadata returns a PublisherConfig.ShardingKey function that
// uses the value of the metadata field key: messages with equal values go to
// the same queue, in publish order. Messages without the field go round robin.
func ShardingKeyFromMetadata(key string) func(topic string, msg *message.Message) string {
	return func(_ string, msg *message.Message) string { return msg.Metadata.Get(key) }
}

type queueCtxKey struct{}

type queueInfo struct {
	queue  protocol.MessageQueue
	offset int64
	group  string
}

// MessageQueueFromCtx returns the queue and queue offset a received message
// was read from, given its Context (msg.Context()).
func MessageQueueFromCtx(ctx context.Context) (q protocol.MessageQueue, offset int64, ok bool) {
	qi, ok := ctx.Value(queueCtxKey{}).(*queueInfo)
	if !ok {
		return protocol.MessageQueue{}, 0, false
	}
	return qi.queue, qi.offset, true
}

// ConsumerGroupFromCtx returns the consumer group a received message was
// read by, given its Context.
func ConsumerGroupFromCtx(ctx context.Context) (string, bool) {
	qi, ok := ctx.Value(queueCtxKey{}).(*queueInfo)
	if !ok {
		return "", false
	}
	return qi.group, true
}
