package protocol

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// POP consumption (RocketMQ 5): receipt handles, offset infos and the JSON
// bodies of BATCH_ACK_MESSAGE, QUERY_ASSIGNMENT and
// SET_MESSAGE_REQUEST_MODE. Sources: Java ExtraInfoUtil, KeyBuilder,
// BatchAck, BatchAckMessageRequestBody, QueryAssignmentRequestBody,
// QueryAssignmentResponseBody, SetMessageRequestModeRequestBody,
// MessageQueueAssignment.

// PopOrderReviveQueue is the revive queue id of orderly pops (Java
// KeyBuilder.POP_ORDER_REVIVE_QUEUE): a receipt handle with it is orderly.
const PopOrderReviveQueue = 999

// Retry flags of receipt handles and offset infos: the message came from
// the topic itself, from its pop retry topic (v1: "%RETRY%<group>_<topic>")
// or from a v2 pop retry topic ("%RETRY%<group>+<topic>").
const (
	PopNormalTopic = "0"
	PopRetryV1     = "1"
	PopRetryV2     = "2"
)

// PopRetryTopicV1 is the pop retry topic of group on topic,
// "%RETRY%<group>_<topic>" (brokers with enableRetryTopicV2=false, the
// default).
func PopRetryTopicV1(topic, group string) string { return "%RETRY%" + group + "_" + topic }

// PopRetryTopicV2 is "%RETRY%<group>+<topic>".
func PopRetryTopicV2(topic, group string) string { return "%RETRY%" + group + "+" + topic }

// PopRetryFlag returns the retry flag of a topic name (ExtraInfoUtil.getRetry).
func PopRetryFlag(topic string) string {
	switch {
	case strings.HasPrefix(topic, "%RETRY%") && strings.Contains(topic, "+"):
		return PopRetryV2
	case strings.HasPrefix(topic, "%RETRY%"):
		return PopRetryV1
	}
	return PopNormalTopic
}

// PopRealTopic returns the topic a retry flag names for topic and group
// (ExtraInfoUtil.getRealTopic).
func PopRealTopic(topic, group, flag string) (string, error) {
	switch flag {
	case PopNormalTopic:
		return topic, nil
	case PopRetryV1:
		return PopRetryTopicV1(topic, group), nil
	case PopRetryV2:
		return PopRetryTopicV2(topic, group), nil
	}
	return "", fmt.Errorf("%w: unknown retry flag %q", ErrBadHeader, flag)
}

// ExtraInfo is a POP receipt handle (the POP_CK property of a popped
// message, the extraInfo of ACK_MESSAGE and CHANGE_MESSAGE_INVISIBLETIME):
// "ckQueueOffset popTime invisibleTime reviveQid retryFlag brokerName
// queueId msgQueueOffset".
type ExtraInfo struct {
	CkQueueOffset  int64 // start offset of the pop that returned the message
	PopTime        int64 // ms
	InvisibleTime  int64 // ms
	ReviveQID      int32
	Retry          string // PopNormalTopic, PopRetryV1, PopRetryV2
	BrokerName     string
	QueueID        int32
	MsgQueueOffset int64 // -1 when the handle has no eighth field
}

// String encodes the handle as Java's ExtraInfoUtil.buildExtraInfo.
func (e ExtraInfo) String() string {
	b := make([]byte, 0, 64)
	b = strconv.AppendInt(b, e.CkQueueOffset, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, e.PopTime, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, e.InvisibleTime, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(e.ReviveQID), 10)
	b = append(b, ' ')
	b = append(b, e.Retry...)
	b = append(b, ' ')
	b = append(b, e.BrokerName...)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(e.QueueID), 10)
	if e.MsgQueueOffset >= 0 {
		b = append(b, ' ')
		b = strconv.AppendInt(b, e.MsgQueueOffset, 10)
	}
	return string(b)
}

// Order reports whether the handle comes from an orderly pop.
func (e ExtraInfo) Order() bool { return e.ReviveQID == PopOrderReviveQueue }

// ParseExtraInfo decodes a receipt handle (7 or 8 space-separated fields).
func ParseExtraInfo(s string) (ExtraInfo, error) {
	f := strings.Split(s, " ")
	if len(f) < 7 {
		return ExtraInfo{}, fmt.Errorf("%w: receipt handle %q has %d fields, want 7 or 8", ErrBadHeader, s, len(f))
	}
	var e ExtraInfo
	var err error
	num := func(i int, bits int) int64 {
		if err != nil {
			return 0
		}
		var v int64
		v, err = strconv.ParseInt(f[i], 10, bits)
		return v
	}
	e.CkQueueOffset = num(0, 64)
	e.PopTime = num(1, 64)
	e.InvisibleTime = num(2, 64)
	e.ReviveQID = int32(num(3, 32))
	e.Retry = f[4]
	e.BrokerName = f[5]
	e.QueueID = int32(num(6, 32))
	e.MsgQueueOffset = -1
	if len(f) > 7 {
		e.MsgQueueOffset = num(7, 64)
	}
	if err != nil {
		return ExtraInfo{}, fmt.Errorf("%w: receipt handle %q: %w", ErrBadHeader, s, err)
	}
	return e, nil
}

// AppendStartOffsetInfo appends one "retry queueId startOffset" item of a
// POP response's startOffsetInfo (items separated by ';').
func AppendStartOffsetInfo(b []byte, topic string, queueID int32, start int64) []byte {
	if len(b) > 0 {
		b = append(b, ';')
	}
	b = append(b, PopRetryFlag(topic)...)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(queueID), 10)
	b = append(b, ' ')
	return strconv.AppendInt(b, start, 10)
}

// AppendMsgOffsetInfo appends one "retry queueId off1,off2,…" item of a
// POP response's msgOffsetInfo.
func AppendMsgOffsetInfo(b []byte, topic string, queueID int32, offsets []int64) []byte {
	if len(b) > 0 {
		b = append(b, ';')
	}
	b = append(b, PopRetryFlag(topic)...)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(queueID), 10)
	b = append(b, ' ')
	for i, o := range offsets {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, o, 10)
	}
	return b
}

// AppendOrderCountInfo appends an orderCountInfo item: "retry qo<queueId>%<offset>
// count" for a message (offset >= 0) or "retry queueId count" for a queue.
func AppendOrderCountInfo(b []byte, topic string, queueID int32, offset int64, count int) []byte {
	if len(b) > 0 {
		b = append(b, ';')
	}
	b = append(b, PopRetryFlag(topic)...)
	b = append(b, ' ')
	if offset >= 0 {
		b = append(b, "qo"...)
		b = strconv.AppendInt(b, int64(queueID), 10)
		b = append(b, '%')
		b = strconv.AppendInt(b, offset, 10)
	} else {
		b = strconv.AppendInt(b, int64(queueID), 10)
	}
	b = append(b, ' ')
	return strconv.AppendInt(b, int64(count), 10)
}

// PopOffsetInfo is a parsed offset info: by "retry@queueId" key (or
// "retry@qo<queueId>%<offset>" for order counts) its values.
type PopOffsetInfo map[string][]int64

// PopInfoKey is the key of ParsePopOffsetInfo's map for a queue of topic.
func PopInfoKey(topic string, queueID int32) string {
	return PopRetryFlag(topic) + "@" + strconv.Itoa(int(queueID))
}

// PopOrderCountKey is the key of a message's order count.
func PopOrderCountKey(topic string, queueID int32, offset int64) string {
	return PopRetryFlag(topic) + "@qo" + strconv.Itoa(int(queueID)) + "%" + strconv.FormatInt(offset, 10)
}

// ParsePopOffsetInfo parses startOffsetInfo, msgOffsetInfo or
// orderCountInfo ("" = none): items "retry key values" separated by ';',
// values separated by ','; keys must not repeat (Java's rule).
func ParsePopOffsetInfo(s string) (PopOffsetInfo, error) {
	if s == "" {
		return nil, nil
	}
	out := PopOffsetInfo{}
	for _, item := range strings.Split(s, ";") {
		f := strings.Split(item, " ")
		if len(f) != 3 {
			return nil, fmt.Errorf("%w: pop offset info item %q", ErrBadHeader, item)
		}
		key := f[0] + "@" + f[1]
		if _, dup := out[key]; dup {
			return nil, fmt.Errorf("%w: pop offset info repeats %q", ErrBadHeader, key)
		}
		var vs []int64
		for _, v := range strings.Split(f[2], ",") {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("%w: pop offset info item %q: %w", ErrBadHeader, item, err)
			}
			vs = append(vs, n)
		}
		out[key] = vs
	}
	return out, nil
}

// BatchAck is one item of a BATCH_ACK_MESSAGE body: the pop of one queue
// (its start offset, pop and invisible times) and a bit per acked message
// (bit i = StartOffset + i), as Java's BatchAck with its short JSON names.
type BatchAck struct {
	ConsumerGroup string
	Topic         string
	Retry         string
	StartOffset   int64
	QueueID       int32
	ReviveQueueID int32
	PopTime       int64
	InvisibleTime int64
	// Bits are the acked offsets relative to StartOffset.
	Bits []int
}

type batchAckJSON struct {
	C  string `json:"c"`
	T  string `json:"t"`
	R  string `json:"r"`
	SO int64  `json:"so"`
	Q  int32  `json:"q"`
	RQ int32  `json:"rq"`
	PT int64  `json:"pt"`
	IT int64  `json:"it"`
	B  string `json:"b"` // java.util.BitSet.toByteArray, base64
}

// maxBatchAckBit bounds the bits of one BatchAck.
const maxBatchAckBit = 1 << 16

// MarshalJSON writes the short names and the bit set as base64 of
// BitSet.toByteArray (little-endian bytes).
func (a BatchAck) MarshalJSON() ([]byte, error) {
	top := -1
	for _, i := range a.Bits {
		if i < 0 || i >= maxBatchAckBit {
			return nil, fmt.Errorf("protocol: batch ack bit %d out of range", i)
		}
		top = max(top, i)
	}
	bits := make([]byte, (top+8)/8)
	for _, i := range a.Bits {
		bits[i/8] |= 1 << (i % 8)
	}
	return json.Marshal(batchAckJSON{C: a.ConsumerGroup, T: a.Topic, R: a.Retry, SO: a.StartOffset, Q: a.QueueID,
		RQ: a.ReviveQueueID, PT: a.PopTime, IT: a.InvisibleTime, B: base64.StdEncoding.EncodeToString(bits)})
}

// UnmarshalJSON reads the short names (and the long alternates Java's
// fastjson accepts).
func (a *BatchAck) UnmarshalJSON(b []byte) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	get := func(short, long string, v any) error {
		raw, ok := m[short]
		if !ok {
			raw, ok = m[long]
		}
		if !ok || string(raw) == "null" {
			return nil
		}
		return json.Unmarshal(raw, v)
	}
	var bits string
	err := errors.Join(get("c", "consumerGroup", &a.ConsumerGroup), get("t", "topic", &a.Topic),
		get("r", "retry", &a.Retry), get("so", "startOffset", &a.StartOffset), get("q", "queueId", &a.QueueID),
		get("rq", "reviveQueueId", &a.ReviveQueueID), get("pt", "popTime", &a.PopTime),
		get("it", "invisibleTime", &a.InvisibleTime), get("b", "bitSet", &bits))
	if err != nil {
		return err
	}
	raw, err := base64.StdEncoding.DecodeString(bits)
	if err != nil {
		return fmt.Errorf("batch ack bit set: %w", err)
	}
	if len(raw)*8 > maxBatchAckBit {
		return fmt.Errorf("batch ack bit set of %d bytes is too large", len(raw))
	}
	a.Bits = a.Bits[:0]
	for i, by := range raw {
		for j := range 8 {
			if by&(1<<j) != 0 {
				a.Bits = append(a.Bits, i*8+j)
			}
		}
	}
	return nil
}

// BatchAckMessageRequestBody is the BATCH_ACK_MESSAGE body.
type BatchAckMessageRequestBody struct {
	BrokerName string     `json:"brokerName"`
	Acks       []BatchAck `json:"acks"`
}

// Decode parses a BATCH_ACK_MESSAGE body.
func (b *BatchAckMessageRequestBody) Decode(body []byte) error {
	*b = BatchAckMessageRequestBody{}
	return decodeBody("batch ack", body, b)
}

// Encode returns the body as JSON.
func (b *BatchAckMessageRequestBody) Encode() ([]byte, error) { return encodeBody("batch ack", b) }

// Message request modes of a group on a topic (Java MessageRequestMode).
const (
	RequestModePull = "PULL"
	RequestModePop  = "POP"
)

// QueryAssignmentRequestBody is the QUERY_ASSIGNMENT body.
type QueryAssignmentRequestBody struct {
	Topic         string `json:"topic"`
	ConsumerGroup string `json:"consumerGroup"`
	ClientID      string `json:"clientId"`
	StrategyName  string `json:"strategyName"`
	MessageModel  string `json:"messageModel"`
}

// Decode parses a QUERY_ASSIGNMENT body.
func (b *QueryAssignmentRequestBody) Decode(body []byte) error {
	*b = QueryAssignmentRequestBody{}
	return decodeBody("query assignment", body, b)
}

// Encode returns the body as JSON.
func (b *QueryAssignmentRequestBody) Encode() ([]byte, error) {
	return encodeBody("query assignment", b)
}

// MessageQueueAssignment is a queue assigned by QUERY_ASSIGNMENT and how to
// consume it (PULL or POP; queue id -1 = pop every queue of the broker).
type MessageQueueAssignment struct {
	MessageQueue MessageQueue      `json:"messageQueue"`
	Mode         string            `json:"mode"`
	Attachments  map[string]string `json:"attachments"`
}

// QueryAssignmentResponseBody is the QUERY_ASSIGNMENT response body.
type QueryAssignmentResponseBody struct {
	MessageQueueAssignments []MessageQueueAssignment `json:"messageQueueAssignments"`
}

// Decode parses a QUERY_ASSIGNMENT response body.
func (b *QueryAssignmentResponseBody) Decode(body []byte) error {
	*b = QueryAssignmentResponseBody{}
	return decodeBody("query assignment response", body, b)
}

// Encode returns the body as JSON (an empty set as []).
func (b *QueryAssignmentResponseBody) Encode() ([]byte, error) {
	c := *b
	c.MessageQueueAssignments = nonNil(c.MessageQueueAssignments)
	return encodeBody("query assignment response", &c)
}

// SetMessageRequestModeRequestBody is the SET_MESSAGE_REQUEST_MODE body.
type SetMessageRequestModeRequestBody struct {
	Topic            string `json:"topic"`
	ConsumerGroup    string `json:"consumerGroup"`
	Mode             string `json:"mode"`
	PopShareQueueNum int32  `json:"popShareQueueNum"`
}

// Decode parses a SET_MESSAGE_REQUEST_MODE body.
func (b *SetMessageRequestModeRequestBody) Decode(body []byte) error {
	*b = SetMessageRequestModeRequestBody{Mode: RequestModePull}
	return decodeBody("set message request mode", body, b)
}

// Encode returns the body as JSON.
func (b *SetMessageRequestModeRequestBody) Encode() ([]byte, error) {
	return encodeBody("set message request mode", b)
}
