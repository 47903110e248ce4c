package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
)

// Values of ConsumerData fields (Java enum names).
const (
	ConsumeActively  = "CONSUME_ACTIVELY"  // pull / lite pull consumer
	ConsumePassively = "CONSUME_PASSIVELY" // push consumer
	ConsumePop       = "CONSUME_POP"       // pop consumer

	MessageModelClustering   = "CLUSTERING"
	MessageModelBroadcasting = "BROADCASTING"

	ConsumeFromLastOffset  = "CONSUME_FROM_LAST_OFFSET"
	ConsumeFromFirstOffset = "CONSUME_FROM_FIRST_OFFSET"
	ConsumeFromTimestamp   = "CONSUME_FROM_TIMESTAMP"

	ExpressionTypeTag   = "TAG"
	ExpressionTypeSQL92 = "SQL92"
)

// HeartbeatData is the HEART_BEAT request body (§5.2).
type HeartbeatData struct {
	ClientID             string         `json:"clientID"`
	ConsumerDataSet      []ConsumerData `json:"consumerDataSet"`
	HeartbeatFingerprint int32          `json:"heartbeatFingerprint"`
	ProducerDataSet      []ProducerData `json:"producerDataSet"`
	WithoutSub           bool           `json:"withoutSub"`
}

// ProducerData names one producer group of a client.
type ProducerData struct {
	GroupName string `json:"groupName"`
}

// ConsumerData describes one consumer group of a client.
type ConsumerData struct {
	ConsumeFromWhere    string             `json:"consumeFromWhere"`
	ConsumeType         string             `json:"consumeType"`
	GroupName           string             `json:"groupName"`
	MessageModel        string             `json:"messageModel"`
	SubscriptionDataSet []SubscriptionData `json:"subscriptionDataSet"`
	UnitMode            bool               `json:"unitMode"`
}

// SubscriptionData is one topic subscription of a consumer group.
type SubscriptionData struct {
	ClassFilterMode bool     `json:"classFilterMode"`
	CodeSet         TagCodes `json:"codeSet"`
	ExpressionType  string   `json:"expressionType"`
	SubString       string   `json:"subString"`
	// SubVersion is decoded as an exact int64 (the Go client sends
	// UnixNano, ≈1.7e18, beyond float64 precision).
	SubVersion int64    `json:"subVersion"`
	TagsSet    []string `json:"tagsSet"`
	Topic      string   `json:"topic"`
}

// CheckClientRequestBody is the CHECK_CLIENT_CONFIG request body (Java
// CheckClientRequestBody): before it starts, a Java consumer asks each
// broker of a topic it subscribes to with a non-TAG expression whether the
// broker can serve it.
type CheckClientRequestBody struct {
	ClientID         string            `json:"clientId"`
	Group            string            `json:"group"`
	Namespace        string            `json:"namespace"`
	SubscriptionData *SubscriptionData `json:"subscriptionData"`
}

// Decode parses a CHECK_CLIENT_CONFIG body.
func (c *CheckClientRequestBody) Decode(b []byte) error {
	*c = CheckClientRequestBody{}
	return decodeBody("check client config", b, c)
}

// Encode returns the body as JSON, empty sets of the subscription as [].
func (c *CheckClientRequestBody) Encode() ([]byte, error) {
	cc := *c
	if c.SubscriptionData != nil {
		sd := *c.SubscriptionData
		sd.TagsSet, sd.CodeSet = nonNil(sd.TagsSet), nonNil(sd.CodeSet)
		cc.SubscriptionData = &sd
	}
	return encodeBody("check client config", &cc)
}

// NewTagSubscription builds the SubscriptionData of a TAG expression the way
// the Java client does (tagsSet and codeSet from ParseTagExpression; "*" for
// all).
func NewTagSubscription(topic, expr string, subVersion int64) SubscriptionData {
	f := ParseTagExpression(expr)
	s := SubscriptionData{Topic: topic, SubString: expr, ExpressionType: ExpressionTypeTag,
		SubVersion: subVersion, TagsSet: []string{}, CodeSet: TagCodes{}}
	if f.All {
		s.SubString = TagExpressionAll
		return s
	}
	s.TagsSet = f.Tags
	s.CodeSet = f.Codes()
	return s
}

// TagCodes is the codeSet of a subscription: Java tag hash codes. It decodes
// from JSON numbers or numeric strings (the Go client sends strings) and
// encodes as numbers (as Java does).
type TagCodes []int32

// UnmarshalJSON accepts an array of numbers and/or numeric strings.
func (c *TagCodes) UnmarshalJSON(b []byte) error {
	if string(bytes.TrimSpace(b)) == "null" {
		*c = nil
		return nil
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	out := make(TagCodes, 0, len(raw))
	for _, r := range raw {
		s := string(bytes.TrimSpace(r))
		if len(s) >= 2 && s[0] == '"' {
			if err := json.Unmarshal(r, &s); err != nil {
				return err
			}
		}
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v < math.MinInt32 || v > math.MaxInt32 {
			return fmt.Errorf("codeSet element %q is not an int32", s)
		}
		out = append(out, int32(v))
	}
	*c = out
	return nil
}

// Decode parses a heartbeat body from the Go or Java client. Errors wrap
// ErrBodyInvalid.
func (h *HeartbeatData) Decode(b []byte) error {
	*h = HeartbeatData{}
	return decodeBody("heartbeat", b, h)
}

// Encode returns the heartbeat as compact JSON in Java field order, with
// empty sets written as [] and codeSet as numbers.
func (h *HeartbeatData) Encode() ([]byte, error) {
	c := *h
	c.ProducerDataSet = nonNil(c.ProducerDataSet)
	c.ConsumerDataSet = make([]ConsumerData, len(h.ConsumerDataSet))
	for i, cd := range h.ConsumerDataSet {
		cd.SubscriptionDataSet = make([]SubscriptionData, len(cd.SubscriptionDataSet))
		for j, s := range h.ConsumerDataSet[i].SubscriptionDataSet {
			s.TagsSet, s.CodeSet = nonNil(s.TagsSet), nonNil(s.CodeSet)
			cd.SubscriptionDataSet[j] = s
		}
		c.ConsumerDataSet[i] = cd
	}
	return encodeBody("heartbeat", &c)
}

func nonNil[S ~[]E, E any](s S) S {
	if s == nil {
		return S{}
	}
	return s
}

// LockBatchRequestBody is the LOCK_BATCH_MQ request body (§5.3).
type LockBatchRequestBody struct {
	ClientID       string         `json:"clientId"`
	ConsumerGroup  string         `json:"consumerGroup"`
	MQSet          []MessageQueue `json:"mqSet"`
	OnlyThisBroker bool           `json:"onlyThisBroker"`
}

// Decode parses the body. Errors wrap ErrBodyInvalid.
func (l *LockBatchRequestBody) Decode(b []byte) error {
	*l = LockBatchRequestBody{}
	return decodeBody("lock batch request", b, l)
}

// Encode returns the body as compact JSON.
func (l *LockBatchRequestBody) Encode() ([]byte, error) {
	c := *l
	c.MQSet = nonNil(c.MQSet)
	return encodeBody("lock batch request", &c)
}

// UnlockBatchRequestBody is the UNLOCK_BATCH_MQ request body (§5.3); same
// fields as LockBatchRequestBody.
type UnlockBatchRequestBody LockBatchRequestBody

// Decode parses the body. Errors wrap ErrBodyInvalid.
func (u *UnlockBatchRequestBody) Decode(b []byte) error {
	return (*LockBatchRequestBody)(u).Decode(b)
}

// Encode returns the body as compact JSON.
func (u *UnlockBatchRequestBody) Encode() ([]byte, error) {
	return (*LockBatchRequestBody)(u).Encode()
}

// LockBatchResponseBody is the LOCK_BATCH_MQ response body: the queues now
// locked by the requesting client.
type LockBatchResponseBody struct {
	LockOKMQSet []MessageQueue `json:"lockOKMQSet"`
}

// Decode parses the body; an empty body means nothing was locked. Errors wrap
// ErrBodyInvalid.
func (l *LockBatchResponseBody) Decode(b []byte) error {
	*l = LockBatchResponseBody{}
	if len(bytes.TrimSpace(b)) == 0 {
		return nil
	}
	return decodeBody("lock batch response", b, l)
}

// Encode returns the body as compact JSON (lockOKMQSet always an array).
func (l *LockBatchResponseBody) Encode() ([]byte, error) {
	return encodeBody("lock batch response", &LockBatchResponseBody{LockOKMQSet: nonNil(l.LockOKMQSet)})
}

// GetConsumerListByGroupResponseBody is the GET_CONSUMER_LIST_BY_GROUP
// response body (§5.4).
type GetConsumerListByGroupResponseBody struct {
	ConsumerIDList []string `json:"consumerIdList"`
}

// Decode parses the body. Errors wrap ErrBodyInvalid.
func (g *GetConsumerListByGroupResponseBody) Decode(b []byte) error {
	*g = GetConsumerListByGroupResponseBody{}
	return decodeBody("consumer list", b, g)
}

// Encode returns the body as compact JSON (consumerIdList always an array).
func (g *GetConsumerListByGroupResponseBody) Encode() ([]byte, error) {
	return encodeBody("consumer list", &GetConsumerListByGroupResponseBody{ConsumerIDList: nonNil(g.ConsumerIDList)})
}
