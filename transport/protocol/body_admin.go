package protocol

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// DataVersion versions a broker's or name server's metadata.
type DataVersion struct {
	Counter      int64 `json:"counter"`
	StateVersion int64 `json:"stateVersion"`
	Timestamp    int64 `json:"timestamp"` // ms
}

// TopicFilterType values of TopicConfig.
const (
	TopicFilterSingleTag = "SINGLE_TAG"
	TopicFilterMultiTag  = "MULTI_TAG"
)

// TopicConfig is a broker's configuration of one topic.
type TopicConfig struct {
	Attributes      map[string]string `json:"attributes"`
	Order           bool              `json:"order"`
	Perm            int32             `json:"perm"`
	ReadQueueNums   int32             `json:"readQueueNums"`
	TopicFilterType string            `json:"topicFilterType"`
	TopicName       string            `json:"topicName"`
	TopicSysFlag    int32             `json:"topicSysFlag"`
	WriteQueueNums  int32             `json:"writeQueueNums"`
}

// TopicConfigSerializeWrapper is the GET_ALL_TOPIC_CONFIG body and the inner
// object of RegisterBrokerBody (§5.7). The static-topic mapping tables are
// kept as raw JSON.
type TopicConfigSerializeWrapper struct {
	DataVersion                DataVersion            `json:"dataVersion"`
	MappingDataVersion         *DataVersion           `json:"mappingDataVersion,omitempty"`
	TopicConfigTable           map[string]TopicConfig `json:"topicConfigTable"`
	TopicQueueMappingDetailMap json.RawMessage        `json:"topicQueueMappingDetailMap,omitempty"`
	TopicQueueMappingInfoMap   json.RawMessage        `json:"topicQueueMappingInfoMap,omitempty"`
}

// Decode parses the body. Errors wrap ErrBodyInvalid.
func (w *TopicConfigSerializeWrapper) Decode(b []byte) error {
	*w = TopicConfigSerializeWrapper{}
	return decodeBody("topic config wrapper", b, w)
}

// Encode returns the body as compact JSON (topicConfigTable always an
// object, attributes always objects).
func (w *TopicConfigSerializeWrapper) Encode() ([]byte, error) {
	return encodeBody("topic config wrapper", w.normalized())
}

func (w *TopicConfigSerializeWrapper) normalized() *TopicConfigSerializeWrapper {
	c := *w
	c.TopicConfigTable = make(map[string]TopicConfig, len(w.TopicConfigTable))
	for k, t := range w.TopicConfigTable {
		if t.Attributes == nil {
			t.Attributes = map[string]string{}
		}
		c.TopicConfigTable[k] = t
	}
	return &c
}

// RegisterBrokerBody is the REGISTER_BROKER request body (§5.7).
type RegisterBrokerBody struct {
	FilterServerList            []string                    `json:"filterServerList"`
	TopicConfigSerializeWrapper TopicConfigSerializeWrapper `json:"topicConfigSerializeWrapper"`
}

// Decode parses the uncompressed (JSON) form. Errors wrap ErrBodyInvalid.
func (r *RegisterBrokerBody) Decode(b []byte) error {
	*r = RegisterBrokerBody{}
	return decodeBody("register broker", b, r)
}

// Encode returns the uncompressed form as compact JSON.
func (r *RegisterBrokerBody) Encode() ([]byte, error) {
	c := RegisterBrokerBody{FilterServerList: nonNil(r.FilterServerList), TopicConfigSerializeWrapper: *r.TopicConfigSerializeWrapper.normalized()}
	return encodeBody("register broker", &c)
}

// MaxRegisterTopics bounds the topic count of a compressed RegisterBrokerBody.
const MaxRegisterTopics = 1 << 20

// DecodeCompressed parses the compressed form (header compressed=true): a
// zlib stream of int32-length-prefixed parts (DataVersion JSON, topic count,
// TopicConfig text per topic, filter server list JSON, optional mapping
// infos, which are skipped). At most maxSize bytes are inflated (<= 0 means
// MaxBodySize). The text form of TopicConfig does not carry topicSysFlag or
// order; they decode as zero. Errors wrap ErrBodyInvalid.
func (r *RegisterBrokerBody) DecodeCompressed(b []byte, maxSize int) error {
	if maxSize <= 0 {
		maxSize = MaxBodySize
	}
	raw, err := Decompress(b, maxSize)
	if err != nil {
		return fmt.Errorf("%w: register broker: %w", ErrBodyInvalid, err)
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: compressed register broker: %s", ErrBodyInvalid, fmt.Sprintf(format, args...))
	}
	rd := recReader{b: raw}
	part := func() []byte {
		n := int32(rd.u32())
		if n < 0 {
			rd.bad = true
			return nil
		}
		return rd.take(int(n))
	}
	*r = RegisterBrokerBody{}
	w := &r.TopicConfigSerializeWrapper
	dv := part()
	if rd.bad {
		return bad("truncated data version")
	}
	if err := decodeBody("data version", dv, &w.DataVersion); err != nil {
		return err
	}
	count := int32(rd.u32())
	if rd.bad || count < 0 || count > MaxRegisterTopics {
		return bad("bad topic count %d", count)
	}
	w.TopicConfigTable = make(map[string]TopicConfig, min(int(count), 1024))
	for i := range count {
		p := part()
		if rd.bad {
			return bad("truncated topic %d", i)
		}
		tc, err := ParseTopicConfigText(string(p))
		if err != nil {
			return err
		}
		w.TopicConfigTable[tc.TopicName] = tc
	}
	fl := part()
	if rd.bad {
		return bad("truncated filter server list")
	}
	if err := decodeBody("filter server list", fl, &r.FilterServerList); err != nil {
		return err
	}
	return nil
}

// ParseTopicConfigText parses Java TopicConfig.encode()'s text form
// "<topicName> <readQueueNums> <writeQueueNums> <perm> <topicFilterType>
// [<attributes JSON>]". Errors wrap ErrBodyInvalid.
func ParseTopicConfigText(s string) (TopicConfig, error) {
	f := strings.SplitN(s, " ", 6)
	if len(f) < 5 {
		return TopicConfig{}, fmt.Errorf("%w: topic config text %q has %d fields", ErrBodyInvalid, s, len(f))
	}
	tc := TopicConfig{TopicName: f[0], TopicFilterType: f[4], Attributes: map[string]string{}}
	for i, p := range []*int32{&tc.ReadQueueNums, &tc.WriteQueueNums, &tc.Perm} {
		v, err := strconv.ParseInt(f[i+1], 10, 32)
		if err != nil {
			return TopicConfig{}, fmt.Errorf("%w: topic config text %q: %w", ErrBodyInvalid, s, err)
		}
		*p = int32(v)
	}
	if len(f) == 6 && f[5] != "" {
		if err := decodeBody("topic attributes", []byte(f[5]), &tc.Attributes); err != nil {
			return TopicConfig{}, err
		}
	}
	return tc, nil
}

// EncodeCompressed returns the compressed form of r (see DecodeCompressed),
// zlib at level 9 as Java writes it.
func (r *RegisterBrokerBody) EncodeCompressed() ([]byte, error) {
	w := &r.TopicConfigSerializeWrapper
	var raw []byte
	putPart := func(p []byte) { raw = binary.BigEndian.AppendUint32(raw, uint32(len(p))); raw = append(raw, p...) }
	dv, err := encodeBody("data version", &w.DataVersion)
	if err != nil {
		return nil, err
	}
	putPart(dv)
	raw = binary.BigEndian.AppendUint32(raw, uint32(len(w.TopicConfigTable)))
	for _, name := range sortedKeys(w.TopicConfigTable) {
		tc := w.TopicConfigTable[name]
		attrs, err := encodeBody("topic attributes", nonNilMap(tc.Attributes))
		if err != nil {
			return nil, err
		}
		putPart(fmt.Appendf(nil, "%s %d %d %d %s %s", tc.TopicName, tc.ReadQueueNums, tc.WriteQueueNums, tc.Perm, tc.TopicFilterType, attrs))
	}
	fl, err := encodeBody("filter server list", nonNil(r.FilterServerList))
	if err != nil {
		return nil, err
	}
	putPart(fl)
	return Compress(nil, raw, 9)
}

func nonNilMap[M ~map[K]V, K comparable, V any](m M) M {
	if m == nil {
		return M{}
	}
	return m
}

// KVTable is a string table body, e.g. the REGISTER_BROKER response
// ({"table":{"TopicA":"broker-a:8"}}).
type KVTable struct {
	Table map[string]string `json:"table"`
}

// Decode parses the body. Errors wrap ErrBodyInvalid.
func (k *KVTable) Decode(b []byte) error { *k = KVTable{}; return decodeBody("kv table", b, k) }

// Encode returns the body as compact JSON with sorted keys.
func (k *KVTable) Encode() ([]byte, error) {
	return encodeBody("kv table", &KVTable{Table: nonNilMap(k.Table)})
}

// TopicList is the body of GET_ALL_TOPIC_LIST_FROM_NAMESERVER and similar
// (§5.8).
type TopicList struct {
	BrokerAddr string   `json:"brokerAddr,omitempty"`
	TopicList  []string `json:"topicList"`
}

// Decode parses the body. Errors wrap ErrBodyInvalid.
func (t *TopicList) Decode(b []byte) error { *t = TopicList{}; return decodeBody("topic list", b, t) }

// Encode returns the body as compact JSON (topicList always an array).
func (t *TopicList) Encode() ([]byte, error) {
	return encodeBody("topic list", &TopicList{BrokerAddr: t.BrokerAddr, TopicList: nonNil(t.TopicList)})
}

// ResetOffsetBody is the RESET_CONSUMER_CLIENT_OFFSET request body (§5.9).
type ResetOffsetBody struct {
	OffsetTable map[MessageQueue]int64
}

// Decode parses the fastjson object-key form and the Gson array form.
// Errors wrap ErrBodyInvalid.
func (r *ResetOffsetBody) Decode(b []byte) error {
	var w struct {
		OffsetTable json.RawMessage `json:"offsetTable"`
	}
	if err := decodeBody("reset offset", b, &w); err != nil {
		return err
	}
	m, err := decodeMQMap[int64]("reset offset", w.OffsetTable)
	*r = ResetOffsetBody{OffsetTable: m}
	return err
}

// Encode returns the fastjson form exactly as §5.9 shows it (compact,
// {…}:<offset> pairs, queues sorted by topic, broker, id), which is what the
// Go client's fallback parser and the Java client read.
func (r *ResetOffsetBody) Encode() ([]byte, error) {
	dst := []byte(`{"offsetTable":`)
	dst, err := appendMQMap(dst, r.OffsetTable, func(d []byte, v int64) ([]byte, error) { return strconv.AppendInt(d, v, 10), nil })
	if err != nil {
		return nil, err
	}
	return append(dst, '}'), nil
}

// OffsetWrapper is one queue's offsets in ConsumeStats.
type OffsetWrapper struct {
	BrokerOffset   int64 `json:"brokerOffset"`
	ConsumerOffset int64 `json:"consumerOffset"`
	LastTimestamp  int64 `json:"lastTimestamp"`
	PullOffset     int64 `json:"pullOffset"`
}

// ConsumeStats is the GET_CONSUME_STATS response body (§5.5).
type ConsumeStats struct {
	ConsumeTps  float64
	OffsetTable map[MessageQueue]OffsetWrapper
}

// Decode parses the fastjson object-key form or the Gson array form. Errors
// wrap ErrBodyInvalid.
func (c *ConsumeStats) Decode(b []byte) error {
	var w struct {
		ConsumeTps  float64         `json:"consumeTps"`
		OffsetTable json.RawMessage `json:"offsetTable"`
	}
	if err := decodeBody("consume stats", b, &w); err != nil {
		return err
	}
	m, err := decodeMQMap[OffsetWrapper]("consume stats", w.OffsetTable)
	*c = ConsumeStats{ConsumeTps: w.ConsumeTps, OffsetTable: m}
	return err
}

// Encode returns the fastjson object-key form (as the Java broker sends it).
func (c *ConsumeStats) Encode() ([]byte, error) {
	dst := []byte(`{"consumeTps":`)
	dst = appendJavaDouble(dst, c.ConsumeTps)
	dst = append(dst, `,"offsetTable":`...)
	dst, err := appendMQMap(dst, c.OffsetTable, appendBodyValue[OffsetWrapper])
	if err != nil {
		return nil, err
	}
	return append(dst, '}'), nil
}

// appendJavaDouble writes f like fastjson writes a double (0.0, 1.5, 1.0E10
// is approximated by Go's shortest form). NaN and infinities become 0.0.
func appendJavaDouble(dst []byte, f float64) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		f = 0
	}
	start := len(dst)
	dst = strconv.AppendFloat(dst, f, 'f', -1, 64)
	if !bytes.ContainsAny(dst[start:], ".eE") {
		dst = append(dst, '.', '0')
	}
	return dst
}

// SubscriptionGroupConfig is a broker's configuration of one consumer group.
type SubscriptionGroupConfig struct {
	Attributes                     map[string]string `json:"attributes"`
	BrokerID                       int64             `json:"brokerId"`
	ConsumeBroadcastEnable         bool              `json:"consumeBroadcastEnable"`
	ConsumeEnable                  bool              `json:"consumeEnable"`
	ConsumeFromMinEnable           bool              `json:"consumeFromMinEnable"`
	ConsumeMessageOrderly          bool              `json:"consumeMessageOrderly"`
	ConsumeTimeoutMinute           int32             `json:"consumeTimeoutMinute"`
	GroupName                      string            `json:"groupName"`
	GroupRetryPolicy               json.RawMessage   `json:"groupRetryPolicy,omitempty"`
	GroupSysFlag                   int32             `json:"groupSysFlag"`
	NotifyConsumerIdsChangedEnable bool              `json:"notifyConsumerIdsChangedEnable"`
	RetryMaxTimes                  int32             `json:"retryMaxTimes"`
	RetryQueueNums                 int32             `json:"retryQueueNums"`
	SubscriptionDataSet            json.RawMessage   `json:"subscriptionDataSet,omitempty"`
	WhichBrokerWhenConsumeSlowly   int64             `json:"whichBrokerWhenConsumeSlowly"`
}

// DefaultSubscriptionGroupConfig returns the Java defaults for a group
// auto-created by a broker.
func DefaultSubscriptionGroupConfig(group string) SubscriptionGroupConfig {
	return SubscriptionGroupConfig{
		Attributes: map[string]string{}, GroupName: group,
		ConsumeEnable: true, ConsumeFromMinEnable: true, ConsumeBroadcastEnable: true,
		RetryQueueNums: 1, RetryMaxTimes: 16, WhichBrokerWhenConsumeSlowly: 1,
		NotifyConsumerIdsChangedEnable: true, ConsumeTimeoutMinute: 15,
	}
}

// SubscriptionGroupWrapper is the GET_ALL_SUBSCRIPTIONGROUP_CONFIG body (§5.8).
type SubscriptionGroupWrapper struct {
	DataVersion            DataVersion                        `json:"dataVersion"`
	ForbiddenTable         map[string]map[string]int32        `json:"forbiddenTable"`
	SubscriptionGroupTable map[string]SubscriptionGroupConfig `json:"subscriptionGroupTable"`
}

// Decode parses the body. Errors wrap ErrBodyInvalid.
func (s *SubscriptionGroupWrapper) Decode(b []byte) error {
	*s = SubscriptionGroupWrapper{}
	return decodeBody("subscription group wrapper", b, s)
}

// Encode returns the body as compact JSON.
func (s *SubscriptionGroupWrapper) Encode() ([]byte, error) {
	c := *s
	c.ForbiddenTable = nonNilMap(c.ForbiddenTable)
	c.SubscriptionGroupTable = make(map[string]SubscriptionGroupConfig, len(s.SubscriptionGroupTable))
	for k, g := range s.SubscriptionGroupTable {
		g.Attributes = nonNilMap(g.Attributes)
		c.SubscriptionGroupTable[k] = g
	}
	return encodeBody("subscription group wrapper", &c)
}

// ProcessQueueInfo is a consumer's view of one queue in ConsumerRunningInfo.
type ProcessQueueInfo struct {
	CachedMsgCount          int64 `json:"cachedMsgCount"`
	CachedMsgMaxOffset      int64 `json:"cachedMsgMaxOffset"`
	CachedMsgMinOffset      int64 `json:"cachedMsgMinOffset"`
	CachedMsgSizeInMiB      int64 `json:"cachedMsgSizeInMiB"`
	CommitOffset            int64 `json:"commitOffset"`
	Droped                  bool  `json:"droped"`
	LastConsumeTimestamp    int64 `json:"lastConsumeTimestamp"`
	LastLockTimestamp       int64 `json:"lastLockTimestamp"`
	LastPullTimestamp       int64 `json:"lastPullTimestamp"`
	Locked                  bool  `json:"locked"`
	TransactionMsgCount     int64 `json:"transactionMsgCount"`
	TransactionMsgMaxOffset int64 `json:"transactionMsgMaxOffset"`
	TransactionMsgMinOffset int64 `json:"transactionMsgMinOffset"`
	TryUnlockTimes          int64 `json:"tryUnlockTimes"`
}

// ConsumeStatus is a consumer's per-topic statistics in ConsumerRunningInfo.
type ConsumeStatus struct {
	ConsumeFailedMsgs int64   `json:"consumeFailedMsgs"`
	ConsumeFailedTPS  float64 `json:"consumeFailedTPS"`
	ConsumeOKTPS      float64 `json:"consumeOKTPS"`
	ConsumeRT         float64 `json:"consumeRT"`
	PullRT            float64 `json:"pullRT"`
	PullTPS           float64 `json:"pullTPS"`
}

// ConsumerRunningInfo is the GET_CONSUMER_RUNNING_INFO answer body (§5.10).
// Decoding is tolerant: unknown fields are ignored, property values that are
// numbers or booleans are kept as their JSON text, and the mqTable may use
// the fastjson object-key form or the Gson array form.
type ConsumerRunningInfo struct {
	Properties      map[string]string
	SubscriptionSet []SubscriptionData
	MQTable         map[MessageQueue]ProcessQueueInfo
	StatusTable     map[string]ConsumeStatus
	Jstack          string
}

// looseString decodes any JSON scalar as its text (strings unquoted).
type looseString string

func (l *looseString) UnmarshalJSON(b []byte) error {
	var s string
	if len(b) > 0 && b[0] == '"' {
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
	} else {
		s = string(b)
		if s == "null" {
			s = ""
		}
	}
	*l = looseString(s)
	return nil
}

// Decode parses the body. Errors wrap ErrBodyInvalid.
func (c *ConsumerRunningInfo) Decode(b []byte) error {
	var w struct {
		Properties      map[string]looseString   `json:"properties"`
		SubscriptionSet []SubscriptionData       `json:"subscriptionSet"`
		MQTable         json.RawMessage          `json:"mqTable"`
		StatusTable     map[string]ConsumeStatus `json:"statusTable"`
		Jstack          string                   `json:"jstack"`
	}
	if err := decodeBody("consumer running info", b, &w); err != nil {
		return err
	}
	mq, err := decodeMQMap[ProcessQueueInfo]("consumer running info", w.MQTable)
	*c = ConsumerRunningInfo{SubscriptionSet: w.SubscriptionSet, MQTable: mq, StatusTable: w.StatusTable, Jstack: w.Jstack}
	if w.Properties != nil {
		c.Properties = make(map[string]string, len(w.Properties))
		for k, v := range w.Properties {
			c.Properties[k] = string(v)
		}
	}
	return err
}

// Encode returns the body in the Java field order with mqTable in the
// fastjson object-key form.
func (c *ConsumerRunningInfo) Encode() ([]byte, error) {
	dst := []byte(`{"jstack":`)
	dst = appendBodyString(dst, c.Jstack)
	dst = append(dst, `,"mqTable":`...)
	dst, err := appendMQMap(dst, c.MQTable, appendBodyValue[ProcessQueueInfo])
	if err != nil {
		return nil, err
	}
	dst = append(dst, `,"properties":`...)
	if dst, err = appendBodyValue(dst, nonNilMap(c.Properties)); err != nil {
		return nil, err
	}
	dst = append(dst, `,"statusTable":`...)
	if dst, err = appendBodyValue(dst, nonNilMap(c.StatusTable)); err != nil {
		return nil, err
	}
	dst = append(dst, `,"subscriptionSet":`...)
	subs := make([]SubscriptionData, len(c.SubscriptionSet))
	for i, s := range c.SubscriptionSet {
		s.TagsSet, s.CodeSet = nonNil(s.TagsSet), nonNil(s.CodeSet)
		subs[i] = s
	}
	if dst, err = appendBodyValue(dst, subs); err != nil {
		return nil, err
	}
	return append(dst, '}'), nil
}

// Values of ConsumeMessageDirectlyResult.ConsumeResult (Java CMResult).
const (
	CMResultSuccess        = "CR_SUCCESS"
	CMResultLater          = "CR_LATER"
	CMResultRollback       = "CR_ROLLBACK"
	CMResultCommit         = "CR_COMMIT"
	CMResultThrowException = "CR_THROW_EXCEPTION"
	CMResultReturnNull     = "CR_RETURN_NULL"
)

// ConsumeMessageDirectlyResult is the CONSUME_MESSAGE_DIRECTLY answer body.
type ConsumeMessageDirectlyResult struct {
	AutoCommit     bool   `json:"autoCommit"`
	ConsumeResult  string `json:"consumeResult"`
	Order          bool   `json:"order"`
	Remark         string `json:"remark,omitempty"`
	SpentTimeMills int64  `json:"spentTimeMills"`
}

// Decode parses the body. Errors wrap ErrBodyInvalid.
func (c *ConsumeMessageDirectlyResult) Decode(b []byte) error {
	*c = ConsumeMessageDirectlyResult{}
	return decodeBody("consume message directly result", b, c)
}

// Encode returns the body as compact JSON.
func (c *ConsumeMessageDirectlyResult) Encode() ([]byte, error) {
	return encodeBody("consume message directly result", c)
}
