package rocketmq

import (
	"strings"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// Message is one message read from a queue: the record type of Source.
//
// Body and the properties alias the pull response the message arrived in
// (read-only; keeping a Message keeps that response alive): Clone copies them.
// A Message is a plain value, safe to share between goroutines for reading.
type Message struct {
	// Topic, BrokerName and QueueID identify the queue.
	Topic      string
	BrokerName string
	QueueID    int32
	// QueueOffset is the message's logical offset in its queue.
	QueueOffset int64
	// Body is the message body (decompressed).
	Body []byte
	// BornTime is when the producer created the message (its clock);
	// StoreTime is when the broker stored it.
	BornTime, StoreTime time.Time
	// ReconsumeTimes counts redeliveries (retry topics).
	ReconsumeTimes int32
	// Flag is the producer's user flag.
	Flag int32

	props string // raw properties string (protocol §4.2)
}

func messageFrom(m *protocol.MessageExt, brokerName string) Message {
	return Message{
		Topic:          m.Topic,
		BrokerName:     brokerName,
		QueueID:        m.QueueID,
		QueueOffset:    m.QueueOffset,
		Body:           m.Body,
		BornTime:       time.UnixMilli(m.BornTimestamp),
		StoreTime:      time.UnixMilli(m.StoreTimestamp),
		ReconsumeTimes: m.ReconsumeTimes,
		Flag:           m.Flag,
		props:          m.Properties,
	}
}

// SplitID returns the ID of the split the message was read from.
func (m *Message) SplitID() string { return splitID(m.BrokerName, m.QueueID) }

// Property returns the value of one property (user or system) without
// allocating.
func (m *Message) Property(name string) (string, bool) { return protocol.PropertyValue(m.props, name) }

// Properties returns a new map of every property of the message (user and
// system ones such as TAGS, KEYS and UNIQ_KEY).
func (m *Message) Properties() map[string]string { return protocol.ParseProperties(m.props) }

// RawProperties returns the properties in their wire form (name \x01 value
// \x02 …).
func (m *Message) RawProperties() string { return m.props }

// Tags returns the message's tag ("" when none).
func (m *Message) Tags() string {
	v, _ := protocol.PropertyValue(m.props, protocol.PropTags)
	return v
}

// Keys returns the message's business keys (nil when none).
func (m *Message) Keys() []string {
	v, _ := protocol.PropertyValue(m.props, protocol.PropKeys)
	return strings.Fields(v)
}

// MsgID returns the producer's message id (UNIQ_KEY; "" when absent).
func (m *Message) MsgID() string {
	v, _ := protocol.PropertyValue(m.props, protocol.PropUniqKey)
	return v
}

// Clone returns a copy of m that shares no memory with the pull response.
func (m *Message) Clone() Message {
	c := *m
	c.Topic = strings.Clone(m.Topic)
	c.BrokerName = strings.Clone(m.BrokerName)
	c.Body = append([]byte(nil), m.Body...)
	c.props = strings.Clone(m.props)
	return c
}

// size estimates the memory a buffered message holds, for flow control.
func (m *Message) size() int64 { return int64(len(m.Body)+len(m.props)) + 64 }
