package otel

import (
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// W3C trace context and baggage property names (the HTTP header names,
// lower case), as carried in RocketMQ user properties.
const (
	PropTraceparent = "traceparent"
	PropTracestate  = "tracestate"
	PropBaggage     = "baggage"
)

// PropertiesCarrier is a read-only propagation.TextMapCarrier over a
// message's properties in their wire form (name \x01 value \x02 …), as
// rocketmq.Message.RawProperties and protocol.MessageExt.Properties hold
// them. Get does not allocate; Set does nothing (use the client's Injector,
// or InjectorCarrier, to write).
type PropertiesCarrier string

// Get returns the value of property key ("" when absent).
func (c PropertiesCarrier) Get(key string) string {
	v, _ := protocol.PropertyValue(string(c), key)
	return v
}

// Set does nothing: the properties of a received message are read-only.
func (PropertiesCarrier) Set(string, string) {}

// Keys returns the property names.
func (c PropertiesCarrier) Keys() []string {
	m := protocol.ParseProperties(string(c))
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}

// InjectorCarrier is a propagation.TextMapCarrier over the client's
// Injector, for HookProduce implementations other than Telemetry's.
type InjectorCarrier struct{ In *client.Injector }

// Get returns the value Set gave key.
func (c InjectorCarrier) Get(key string) string { return c.In.Get(key) }

// Set adds property key to the messages being sent.
func (c InjectorCarrier) Set(key, value string) { c.In.Set(key, value) }

// Keys returns the names set so far.
func (c InjectorCarrier) Keys() []string { return c.In.Keys() }

// MapCarrier is a propagation.TextMapCarrier over a client.Message's user
// Properties map (for code that builds messages itself and sends them with
// an unhooked client). Set allocates the map when nil.
type MapCarrier struct{ M *client.Message }

// Get returns the user property key.
func (c MapCarrier) Get(key string) string { return c.M.Properties[key] }

// Set sets the user property key.
func (c MapCarrier) Set(key, value string) {
	if c.M.Properties == nil {
		c.M.Properties = make(map[string]string, 3)
	}
	c.M.Properties[key] = value
}

// Keys returns the user property names.
func (c MapCarrier) Keys() []string {
	keys := make([]string, 0, len(c.M.Properties))
	for k := range c.M.Properties {
		keys = append(keys, k)
	}
	return keys
}

// traceparentSampled parses a W3C traceparent ("00-<32 hex>-<16 hex>-<2
// hex>") without allocating; valid is false when it is malformed or all
// zero, sampled reports its sampled flag.
func traceparentSampled(tp string) (sampled, valid bool) {
	if len(tp) < 55 || tp[2] != '-' || tp[35] != '-' || tp[52] != '-' {
		return false, false
	}
	if tp[0] == 'f' && tp[1] == 'f' {
		return false, false // version ff is invalid
	}
	if len(tp) > 55 && (tp[0] == '0' && tp[1] == '0' || tp[55] != '-') {
		return false, false // version 00 has exactly four fields
	}
	zeroTrace, zeroSpan := true, true
	for i := 0; i < 55; i++ {
		if i == 2 || i == 35 || i == 52 {
			continue
		}
		c := tp[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false, false
		}
		if c != '0' {
			switch {
			case i > 2 && i < 35:
				zeroTrace = false
			case i > 35 && i < 52:
				zeroSpan = false
			}
		}
	}
	if zeroTrace || zeroSpan {
		return false, false
	}
	flags := unhex(tp[53])<<4 | unhex(tp[54])
	return flags&1 == 1, true
}

func unhex(c byte) byte {
	if c >= 'a' {
		return c - 'a' + 10
	}
	return c - '0'
}
