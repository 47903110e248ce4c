package protocol

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Message properties are carried as one string (protocol §4.2):
// name + "\x01" + value + "\x02" for every pair, in no particular order.
// The functions below work on that raw form without building a map, so that a
// broker or consumer can look up one key (TAGS, UNIQ_KEY, ...) with no
// allocation.

const (
	// PropNameValueSeparator separates a property name from its value.
	PropNameValueSeparator = '\x01'
	// PropSeparator terminates every property pair.
	PropSeparator = '\x02'
	// MaxPropertiesLength is the longest properties string a stored record
	// or a send request may carry (its length is an int16 in records).
	MaxPropertiesLength = 32767
)

// Well-known property keys (protocol §4.3, Java MessageConst).
const (
	PropKeys                     = "KEYS"                           // space-separated business keys
	PropTags                     = "TAGS"                           // message tag
	PropWaitStoreMsgOK           = "WAIT"                           // "true": wait for flush/replication
	PropDelayLevel               = "DELAY"                          // delay level 1..18
	PropRetryTopic               = "RETRY_TOPIC"                    // original topic of a retry message
	PropRealTopic                = "REAL_TOPIC"                     // original topic while scheduled/half
	PropRealQueueID              = "REAL_QID"                       // original queue id while scheduled/half
	PropTransactionPrepared      = "TRAN_MSG"                       // "true" on half messages
	PropProducerGroup            = "PGROUP"                         // producer group of a transactional message
	PropMinOffset                = "MIN_OFFSET"                     // added client-side from pull response
	PropMaxOffset                = "MAX_OFFSET"                     // added client-side from pull response
	PropBuyerID                  = "BUYER_ID"                       // legacy
	PropOriginMessageID          = "ORIGIN_MESSAGE_ID"              // msgId of the first delivery
	PropTransferFlag             = "TRANSFER_FLAG"                  // legacy
	PropCorrectionFlag           = "CORRECTION_FLAG"                // legacy
	PropMQ2Flag                  = "MQ2_FLAG"                       // legacy
	PropReconsumeTime            = "RECONSUME_TIME"                 // client-side reconsume count
	PropMsgRegion                = "MSG_REGION"                     // broker region id
	PropTraceSwitch              = "TRACE_ON"                       // broker trace switch
	PropUniqKey                  = "UNIQ_KEY"                       // unique client message id
	PropExtendUniqInfo           = "EXTEND_UNIQ_INFO"               // extension of UNIQ_KEY
	PropMaxReconsumeTimes        = "MAX_RECONSUME_TIMES"            // per-message retry limit
	PropConsumeStartTime         = "CONSUME_START_TIME"             // client-side consume start
	PropInnerNum                 = "INNER_NUM"                      // inner batch count
	PropInnerBase                = "INNER_BASE"                     // inner batch base offset
	PropDupInfo                  = "DUP_INFO"                       // duplication info
	PropCheckImmunityTime        = "CHECK_IMMUNITY_TIME_IN_SECONDS" // first check-back delay
	PropTransactionPreparedQueue = "TRAN_PREPARED_QUEUE_OFFSET"     // half message queue offset
	PropTransactionID            = "__transactionId__"              // transaction id
	PropTransactionCheckTimes    = "TRANSACTION_CHECK_TIMES"        // check-backs done so far
	PropInstanceID               = "INSTANCE_ID"                    // instance id
	PropCorrelationID            = "CORRELATION_ID"                 // request/reply correlation
	PropReplyToClient            = "REPLY_TO_CLIENT"                // clientID of a requester
	PropTTL                      = "TTL"                            // request timeout
	PropArriveTime               = "ARRIVE_TIME"                    // reply arrival time
	PropPushReplyTime            = "PUSH_REPLY_TIME"                // broker reply push time
	PropCluster                  = "CLUSTER"                        // cluster name, added by the broker
	PropMsgType                  = "MSG_TYPE"                       // "reply" for reply messages
	PropPopCK                    = "POP_CK"                         // pop receipt handle
	PropPopCKOffset              = "POP_CK_OFFSET"                  // pop checkpoint offset
	PropFirstPopTime             = "1ST_POP_TIME"                   // first pop time
	PropShardingKey              = "SHARDING_KEY"                   // ordering key as the Go client names it
	PropShardingKeyJava          = "__SHARDINGKEY"                  // ordering key as the Java client names it
	PropTimerDeliverMS           = "TIMER_DELIVER_MS"               // absolute deliver time (ms)
	PropTimerDelaySec            = "TIMER_DELAY_SEC"                // relative delay (s)
	PropTimerDelayMS             = "TIMER_DELAY_MS"                 // relative delay (ms)
	PropTimerEnqueueMS           = "TIMER_ENQUEUE_MS"               // timer internal
	PropTimerDequeueMS           = "TIMER_DEQUEUE_MS"               // timer internal
	PropTimerRollTimes           = "TIMER_ROLL_TIMES"               // timer internal
	PropTimerOutMS               = "TIMER_OUT_MS"                   // timer internal
	PropTimerDelUniqKey          = "TIMER_DEL_UNIQKEY"              // timer internal
	PropTimerDelayLevel          = "TIMER_DELAY_LEVEL"              // timer internal
	PropStartDeliverTime         = "__STARTDELIVERTIME"             // legacy absolute deliver time
	PropBornHost                 = "__BORNHOST"                     // born host
	PropBornTimestamp            = "BORN_TIMESTAMP"                 // born timestamp
	PropCRC32                    = "__CRC32#"                       // optional properties CRC
	PropDLQOriginTopic           = "DLQ_ORIGIN_TOPIC"               // topic before the DLQ
	PropDLQOriginMessageID       = "DLQ_ORIGIN_MESSAGE_ID"          // msgId before the DLQ
	PropTransientPrefix          = "__RMQ.TRANSIENT."               // prefix of non-stored properties
	PropInnerMultiDispatch       = "INNER_MULTI_DISPATCH"           // LMQ dispatch
	PropInnerMultiQueueOffset    = "INNER_MULTI_QUEUE_OFFSET"       // LMQ offsets
)

// ErrPropertiesInvalid reports a property name, value or properties string
// that cannot be carried on the wire.
var ErrPropertiesInvalid = errors.New("protocol: invalid message properties")

// nextProperty splits the first item off raw. It returns the item's name and
// value and whether the item is a valid pair under the Java parsing rules
// (name non-empty, value non-empty; the first \x01 separates, so a value may
// contain further \x01 bytes), and the rest of raw after the \x02.
func nextProperty(raw string) (name, value string, ok bool, rest string) {
	item := raw
	if i := strings.IndexByte(raw, PropSeparator); i >= 0 {
		item, rest = raw[:i], raw[i+1:]
	}
	sep := strings.IndexByte(item, PropNameValueSeparator)
	if sep <= 0 || sep == len(item)-1 {
		return "", "", false, rest
	}
	return item[:sep], item[sep+1:], true, rest
}

// PropertyValue returns the value of key in the raw properties string and
// whether it is present. It follows the Java parser: items with an empty name
// or empty value are ignored, and when a key occurs more than once the last
// occurrence wins. It does not allocate; the returned value aliases raw.
func PropertyValue(raw, key string) (string, bool) {
	if key == "" || strings.IndexByte(key, PropSeparator) >= 0 || strings.IndexByte(key, PropNameValueSeparator) >= 0 {
		return propertyValueScan(raw, key)
	}
	// An item whose name is key starts at the start of raw or after a
	// \x02, and key is followed by the item's first \x01 (key holds none).
	// strings.Index finds candidates with the runtime's vectorised search,
	// several times faster than walking the items one by one when the
	// string carries a dozen properties; candidates inside a value or a
	// longer name are skipped. The search goes on after a match: the last
	// valid occurrence wins.
	var (
		val   string
		found bool
	)
	for from := 0; from < len(raw); {
		i := strings.Index(raw[from:], key)
		if i < 0 {
			break
		}
		i += from
		end := i + len(key)
		if end >= len(raw) || raw[end] != PropNameValueSeparator || (i > 0 && raw[i-1] != PropSeparator) {
			from = i + 1
			continue
		}
		v := raw[end+1:]
		if j := strings.IndexByte(v, PropSeparator); j >= 0 {
			v = v[:j]
		}
		if v != "" {
			val, found = v, true
		}
		from = end + 1 + len(v)
	}
	return val, found
}

// propertyValueScan is PropertyValue item by item, for keys that hold a
// separator or are empty (no item has such a name, but the answer must
// still follow the Java parser's).
func propertyValueScan(raw, key string) (string, bool) {
	var (
		val   string
		found bool
	)
	for len(raw) > 0 {
		n, v, ok, rest := nextProperty(raw)
		if ok && n == key {
			val, found = v, true
		}
		raw = rest
	}
	return val, found
}

// RangeProperties calls fn for every valid pair of raw in wire order until fn
// returns false. Duplicate keys are all reported. It does not allocate; names
// and values alias raw.
func RangeProperties(raw string, fn func(name, value string) bool) {
	for len(raw) > 0 {
		n, v, ok, rest := nextProperty(raw)
		if ok && !fn(n, v) {
			return
		}
		raw = rest
	}
}

// AppendProperty appends one name\x01value\x02 pair to dst. It does not
// validate; use ValidateProperty for names and values from outside.
func AppendProperty(dst []byte, name, value string) []byte {
	dst = append(dst, name...)
	dst = append(dst, PropNameValueSeparator)
	dst = append(dst, value...)
	return append(dst, PropSeparator)
}

// AppendPropertiesExcept appends to dst every valid pair of raw whose name is
// not in drop, in wire order, re-encoded canonically. Use it to replace a
// property: AppendPropertiesExcept then AppendProperty.
func AppendPropertiesExcept(dst []byte, raw string, drop ...string) []byte {
	RangeProperties(raw, func(n, v string) bool {
		if !slices.Contains(drop, n) {
			dst = AppendProperty(dst, n, v)
		}
		return true
	})
	return dst
}

// ParseProperties returns the pairs of raw as a map (last duplicate wins).
// It allocates; hot paths should use PropertyValue or RangeProperties.
func ParseProperties(raw string) map[string]string {
	m := make(map[string]string, strings.Count(raw, string(rune(PropSeparator)))+1)
	RangeProperties(raw, func(n, v string) bool {
		m[n] = v
		return true
	})
	return m
}

// AppendProperties appends the pairs of m to dst in sorted key order, so the
// output is deterministic. Pairs with an empty name or value are skipped, as
// the Java parser would drop them anyway.
func AppendProperties(dst []byte, m map[string]string) []byte {
	keys := make([]string, 0, len(m))
	for k, v := range m {
		if k != "" && v != "" {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		dst = AppendProperty(dst, k, m[k])
	}
	return dst
}

// ValidateProperty reports whether name and value can be carried as a
// property: both non-empty and free of the \x01 and \x02 separators.
func ValidateProperty(name, value string) error {
	if name == "" || value == "" {
		return fmt.Errorf("%w: empty name or value (name %q)", ErrPropertiesInvalid, name)
	}
	if hasSeparator(name) || hasSeparator(value) {
		return fmt.Errorf("%w: property %q contains a separator byte", ErrPropertiesInvalid, name)
	}
	return nil
}

// hasSeparator reports whether s holds \x01 or \x02: one pass over the
// bytes (every property of every message sent is checked).
func hasSeparator(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i]-PropNameValueSeparator < 2 {
			return true
		}
	}
	return false
}

// ValidateProperties reports whether raw fits the wire limits: at most
// MaxPropertiesLength bytes. Malformed items are not an error (the Java and Go
// parsers skip them).
func ValidateProperties(raw string) error {
	if len(raw) > MaxPropertiesLength {
		return fmt.Errorf("%w: length %d exceeds %d", ErrPropertiesInvalid, len(raw), MaxPropertiesLength)
	}
	return nil
}

// TagsHashCode returns the consume-queue tags code of tag: Java's
// String.hashCode over the UTF-16 code units of tag, sign-extended to int64
// (protocol §4.8). Invalid UTF-8 bytes count as U+FFFD, as Java's decoder
// would produce. The empty tag hashes to 0.
func TagsHashCode(tag string) int64 {
	var h int32
	for _, r := range tag {
		if r >= 0x10000 {
			r -= 0x10000
			h = 31*h + int32(0xD800+(r>>10))
			h = 31*h + int32(0xDC00+(r&0x3FF))
			continue
		}
		h = 31*h + r
	}
	return int64(h)
}

// TagsHashCodeUTF8 is the Go client's variant of TagsHashCode: the same
// polynomial over the UTF-8 bytes. It agrees with TagsHashCode only for ASCII
// tags; a broker should prefer comparing tag strings.
func TagsHashCodeUTF8(tag string) int64 {
	var h int32
	for i := 0; i < len(tag); i++ {
		h = 31*h + int32(tag[i])
	}
	return int64(h)
}

// TagExpressionAll is the TAG expression matching every message.
const TagExpressionAll = "*"

// TagFilter is a parsed TAG subscription expression such as "TagA || TagB".
// The zero value matches nothing; use ParseTagExpression.
type TagFilter struct {
	// All is true for "*" or an empty expression.
	All bool
	// Tags holds the distinct, trimmed tags in expression order.
	Tags []string
}

// ParseTagExpression parses a TAG subscription expression like Java's
// FilterAPI: "", "*" (after trimming) mean all tags; otherwise the expression
// is split on "||", each part trimmed, empty parts dropped and duplicates
// removed. An expression with no non-empty part (such as "||") matches
// nothing, as in Java.
func ParseTagExpression(expr string) TagFilter {
	e := strings.TrimSpace(expr)
	if e == "" || e == TagExpressionAll {
		return TagFilter{All: true}
	}
	var f TagFilter
	for part := range strings.SplitSeq(e, "||") {
		t := strings.TrimSpace(part)
		if t != "" && !slices.Contains(f.Tags, t) {
			f.Tags = append(f.Tags, t)
		}
	}
	return f
}

// Match reports whether a message with the given TAGS value passes the filter.
func (f TagFilter) Match(tag string) bool {
	return f.All || slices.Contains(f.Tags, tag)
}

// Codes returns the Java tags hash codes of f.Tags, in order.
func (f TagFilter) Codes() []int32 {
	out := make([]int32, len(f.Tags))
	for i, t := range f.Tags {
		out[i] = int32(TagsHashCode(t))
	}
	return out
}
