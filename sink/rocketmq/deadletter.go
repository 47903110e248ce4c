package rocketmq

import (
	"encoding/hex"
	"strconv"
	"strings"
	"time"

	"github.com/runnel-dev/runnel/sink"
	srcmq "github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/transport/client"
)

// Properties of the messages NewDeadLetter sends.
const (
	// PropReason is the error that rejected the record.
	PropReason = "RUNNEL_DLQ_REASON"
	// PropSource and PropOperator are the UIDs of the record's source and
	// of the operator that rejected it.
	PropSource   = "RUNNEL_DLQ_SOURCE"
	PropOperator = "RUNNEL_DLQ_OPERATOR"
	// PropSplit is the source split ("brokerName/queueId" for RocketMQ
	// sources).
	PropSplit = "RUNNEL_DLQ_SPLIT"
	// PropOffset is the split position after the record, hex-encoded in the
	// source's encoding.
	PropOffset = "RUNNEL_DLQ_OFFSET"
	// PropQueueOffset is the record's queue offset (decimal), present when
	// the source is a RocketMQ source.
	PropQueueOffset = "RUNNEL_DLQ_QUEUE_OFFSET"
	// PropTime is when the record was rejected (RFC 3339, UTC).
	PropTime = "RUNNEL_DLQ_TIME"
	// PropBody says what the body holds: "raw" (the record's original
	// bytes), "value" (a textual rendering of the record) or "none" (the
	// record had neither; the body is the reason).
	PropBody = "RUNNEL_DLQ_BODY"
)

// maxReasonLen bounds PropReason (longer reasons are cut).
const maxReasonLen = 4096

// NewDeadLetter returns a Sink of dead letters (pipeline.DeadLetter's
// records) to topic: one message per record, its body the record's raw
// bytes (or its textual rendering), the reason, source, operator, split and
// offset in properties (PropReason …), and the tag "runnel-dlq".
func NewDeadLetter(p *client.Producer, topic string, opts ...Option) (*Sink[sink.DeadLetter], error) {
	return New(p, func(d sink.DeadLetter) (*client.Message, error) { return DeadLetterMessage(topic, d), nil }, opts...)
}

// DeadLetterMessage returns the message NewDeadLetter sends for d.
func DeadLetterMessage(topic string, d sink.DeadLetter) *client.Message {
	m := &client.Message{Topic: topic, Tags: "runnel-dlq", Properties: make(map[string]string, 8)}
	switch {
	case len(d.Raw) > 0:
		m.Body = d.Raw
		m.Properties[PropBody] = "raw"
	case d.Value != "":
		m.Body = []byte(d.Value)
		m.Properties[PropBody] = "value"
	default:
		m.Body = []byte(d.Reason)
		if len(m.Body) == 0 {
			m.Body = []byte("-")
		}
		m.Properties[PropBody] = "none"
	}
	reason := d.Reason
	if len(reason) > maxReasonLen {
		reason = reason[:maxReasonLen]
	}
	setProp(m, PropReason, reason)
	setProp(m, PropSource, d.Source)
	setProp(m, PropOperator, d.Operator)
	setProp(m, PropSplit, d.Split)
	if len(d.Offset) > 0 {
		setProp(m, PropOffset, hex.EncodeToString(d.Offset))
		if o, err := srcmq.DecodeOffset(d.Offset); err == nil && o.Next > 0 {
			setProp(m, PropQueueOffset, strconv.FormatInt(o.Next-1, 10))
		}
	}
	if !d.Time.IsZero() {
		setProp(m, PropTime, d.Time.UTC().Format(time.RFC3339Nano))
	}
	return m
}

// setProp sets a property unless v is empty, replacing the bytes the
// properties encoding reserves.
func setProp(m *client.Message, k, v string) {
	if v == "" {
		return
	}
	m.Properties[k] = strings.Map(func(r rune) rune {
		if r == 1 || r == 2 {
			return ' '
		}
		return r
	}, v)
}
