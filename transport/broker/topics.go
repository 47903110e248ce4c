package broker

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/runnel-dev/runnel/transport/broker/internal/store"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// Topic names with a meaning to RocketMQ (protocol §7.1).
const (
	topicDefault       = "TBW102"
	topicSelfTest      = "SELF_TEST_TOPIC"
	topicOffsetMoved   = "OFFSET_MOVED_EVENT"
	topicTransHalf     = "RMQ_SYS_TRANS_HALF_TOPIC"
	topicTransOpHalf   = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
	topicTransCheckMax = "TRANS_CHECK_MAX_TIME_TOPIC"
	topicSchedule      = "SCHEDULE_TOPIC_XXXX"
	replyTopicSuffix   = "_REPLY_TOPIC"
	retryPrefix        = "%RETRY%"
	dlqPrefix          = "%DLQ%"
	sysTopicPrefix     = "rmq_sys_"

	// scheduleQueueNums is one queue per delay level.
	scheduleQueueNums = 18

	maxTopicLen      = 127
	maxRetryTopicLen = 255
)

// validateName checks a topic or group name: non-empty, at most maxLen
// bytes, characters [%|a-zA-Z0-9_-] only (Java TopicValidator).
func validateName(s string, maxLen int) error {
	if s == "" {
		return fmt.Errorf("name is blank")
	}
	if len(s) > maxLen {
		return fmt.Errorf("name %.40q… is %d bytes, longer than %d", s, len(s), maxLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9',
			c == '%', c == '|', c == '_', c == '-':
		default:
			return fmt.Errorf("name %q contains the illegal character %q", s, c)
		}
	}
	return nil
}

// validateTopic applies validateName with the topic length limit: 127,
// or 255 for retry and dead-letter topics.
func validateTopic(topic string) error {
	limit := maxTopicLen
	if strings.HasPrefix(topic, retryPrefix) || strings.HasPrefix(topic, dlqPrefix) {
		limit = maxRetryTopicLen
	}
	if err := validateName(topic, limit); err != nil {
		return fmt.Errorf("topic: %w", err)
	}
	return nil
}

// notSendable reports topics producers may not send to (NO_PERMISSION).
func notSendable(topic string) bool {
	switch topic {
	case topicSchedule, topicTransHalf, topicTransOpHalf, topicTransCheckMax, topicSelfTest, topicOffsetMoved, haOpsTopic:
		return true
	}
	return false
}

// isSystemTopic reports topics that admin requests may not create, change
// or delete.
func (b *Broker) isSystemTopic(topic string) bool {
	if notSendable(topic) || topic == topicDefault || strings.HasPrefix(topic, sysTopicPrefix) ||
		strings.HasPrefix(topic, "RMQ_SYS_") {
		return true
	}
	return topic == b.cfg.clusterName || topic == b.cfg.brokerName || topic == b.cfg.clusterName+replyTopicSuffix
}

// topicTable holds the topic configs. Readers (every send and pull) load
// an immutable map; writers serialise on mu, persist, then publish a new
// map (copy on write: topics change rarely).
type topicTable struct {
	mu      sync.Mutex // writers; guards version
	m       atomic.Pointer[map[string]TopicConfig]
	version protocol.DataVersion
}

func (t *topicTable) init() {
	m := map[string]TopicConfig{}
	t.m.Store(&m)
}

func (t *topicTable) get(name string) (TopicConfig, bool) {
	tc, ok := (*t.m.Load())[name]
	return tc, ok
}

// snapshot returns the current table (must not be modified) and version.
func (t *topicTable) snapshot() (map[string]TopicConfig, protocol.DataVersion) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return *t.m.Load(), t.version
}

// publishLocked installs a changed copy. Requires mu.
func (t *topicTable) publishLocked(change func(m map[string]TopicConfig), nowMS int64) {
	m := maps.Clone(*t.m.Load())
	change(m)
	t.m.Store(&m)
	t.version.Counter++
	t.version.Timestamp = nowMS
}

func newTopicConfig(name string, queues, perm int32) TopicConfig {
	return TopicConfig{
		TopicName: name, ReadQueueNums: queues, WriteQueueNums: queues, Perm: perm,
		TopicFilterType: protocol.TopicFilterSingleTag, Attributes: map[string]string{},
	}
}

// queueCount is the number of queue ids of a topic: max(read, write).
func queueCount(tc TopicConfig) int32 { return max(tc.ReadQueueNums, tc.WriteQueueNums) }

// topicConfig returns a topic's config.
func (b *Broker) topicConfig(name string) (TopicConfig, bool) { return b.topics.get(name) }

func (b *Broker) loadTopics() error {
	all, err := b.store.TopicConfigs()
	if err != nil {
		return fmt.Errorf("broker: load topics: %w", err)
	}
	b.topics.mu.Lock()
	defer b.topics.mu.Unlock()
	var bad error
	b.topics.publishLocked(func(m map[string]TopicConfig) {
		for name, v := range all {
			var tc TopicConfig
			if err := json.Unmarshal(v, &tc); err != nil || tc.TopicName != name {
				bad = fmt.Errorf("broker: stored config of topic %q is corrupt: %v", name, err)
				return
			}
			if tc.Attributes == nil {
				tc.Attributes = map[string]string{}
			}
			m[name] = tc
		}
	}, b.now().UnixMilli())
	return bad
}

// createSystemTopics creates the topics a Java broker creates at startup
// (protocol §7.1) when they do not exist yet.
func (b *Broker) createSystemTopics() error {
	rw := protocol.PermRead | protocol.PermWrite
	sys := []TopicConfig{
		newTopicConfig(topicSelfTest, 1, rw),
		newTopicConfig(b.cfg.clusterName+replyTopicSuffix, 1, rw),
		newTopicConfig(topicOffsetMoved, 1, rw),
		newTopicConfig(topicTransHalf, 1, rw),
		newTopicConfig(topicTransOpHalf, 1, rw),
		newTopicConfig(topicSchedule, scheduleQueueNums, rw),
		newTopicConfig(b.cfg.brokerName, 1, rw|protocol.PermInherit),
		newTopicConfig(b.cfg.clusterName, 16, rw|protocol.PermInherit),
	}
	if b.cfg.autoCreateTopics {
		sys = append(sys, newTopicConfig(topicDefault, int32(b.cfg.topicQueueNums), rw|protocol.PermInherit))
	}
	for _, tc := range sys {
		if _, ok := b.topics.get(tc.TopicName); ok {
			continue
		}
		if err := b.putTopic(tc, false); err != nil {
			return err
		}
	}
	return nil
}

// putTopic persists and publishes tc (create or replace) and, if register,
// tells the name servers.
func (b *Broker) putTopic(tc TopicConfig, register bool) error {
	v, err := json.Marshal(tc)
	if err != nil {
		return fmt.Errorf("broker: encode topic %s: %w", tc.TopicName, err)
	}
	b.topics.mu.Lock()
	if err := b.store.PutTopicConfig(tc.TopicName, v); err != nil {
		b.topics.mu.Unlock()
		return fmt.Errorf("broker: persist topic %s: %w", tc.TopicName, err)
	}
	b.topics.publishLocked(func(m map[string]TopicConfig) { m[tc.TopicName] = tc }, b.now().UnixMilli())
	b.topics.mu.Unlock()
	b.log.Info("broker: topic configured", "topic", tc.TopicName, "read", tc.ReadQueueNums,
		"write", tc.WriteQueueNums, "perm", tc.Perm)
	if register {
		b.triggerRegister()
	}
	return nil
}

// createIfAbsent creates tc unless a topic of that name exists; it returns
// the config in force.
func (b *Broker) createIfAbsent(tc TopicConfig) (TopicConfig, error) {
	v, err := json.Marshal(tc)
	if err != nil {
		return TopicConfig{}, fmt.Errorf("broker: encode topic %s: %w", tc.TopicName, err)
	}
	b.topics.mu.Lock()
	if cur, ok := b.topics.get(tc.TopicName); ok {
		b.topics.mu.Unlock()
		return cur, nil
	}
	if err := b.store.PutTopicConfig(tc.TopicName, v); err != nil {
		b.topics.mu.Unlock()
		return TopicConfig{}, fmt.Errorf("broker: persist topic %s: %w", tc.TopicName, err)
	}
	b.topics.publishLocked(func(m map[string]TopicConfig) { m[tc.TopicName] = tc }, b.now().UnixMilli())
	b.topics.mu.Unlock()
	b.log.Info("broker: topic created", "topic", tc.TopicName, "queues", tc.WriteQueueNums, "perm", tc.Perm)
	b.triggerRegister()
	return tc, nil
}

// ensureTopic returns the topic's config, creating it with queues
// read/write queues and perm if it does not exist (and registering it with
// the name servers). Retry, DLQ and schedule logic use it.
func (b *Broker) ensureTopic(_ context.Context, name string, queues int32, perm int32) (TopicConfig, error) {
	if tc, ok := b.topics.get(name); ok {
		return tc, nil
	}
	if err := validateTopic(name); err != nil {
		return TopicConfig{}, fmt.Errorf("broker: %w", err)
	}
	if queues < 1 || queues > MaxQueueNums || !protocol.PermValid(perm) {
		return TopicConfig{}, fmt.Errorf("broker: topic %s: %d queues, perm %d", name, queues, perm)
	}
	return b.createIfAbsent(newTopicConfig(name, queues, perm))
}

// autoCreateTopic implements the send path's topic creation from a
// default topic (Java createTopicInSendMessageMethod): the default topic
// must exist and be inheritable; the new topic gets min(requested,
// default's write queues) queues and the default's permission without
// INHERIT. A %RETRY% topic that cannot be created that way gets one queue.
// ok is false when creation is impossible (TOPIC_NOT_EXIST).
func (b *Broker) autoCreateTopic(topic, defTopic string, reqQueues int32) (TopicConfig, bool, error) {
	def, ok := b.topics.get(defTopic)
	inherit := ok && protocol.PermInheritable(def.Perm)
	if defTopic == topicDefault && !b.cfg.autoCreateTopics {
		inherit = false
	}
	if !inherit {
		if strings.HasPrefix(topic, retryPrefix) {
			tc, err := b.createIfAbsent(newTopicConfig(topic, 1, protocol.PermRead|protocol.PermWrite))
			return tc, err == nil, err
		}
		return TopicConfig{}, false, nil
	}
	queues := min(reqQueues, def.WriteQueueNums)
	if queues < 1 {
		queues = max(1, def.WriteQueueNums)
	}
	tc := newTopicConfig(topic, queues, def.Perm&^protocol.PermInherit)
	tc.TopicFilterType = def.TopicFilterType
	tc, err := b.createIfAbsent(tc)
	return tc, err == nil, err
}

// deleteTopic removes the topic's config, messages and consumer offsets.
// A master also logs the deletion (a record in haOpsTopic, appended right
// after it), which its slaves replay at that place in the log.
func (b *Broker) deleteTopic(name string) error {
	var marker *store.PutMessage
	if !b.isSlave() {
		m, err := b.deletionRecord(name)
		if err != nil {
			return err
		}
		marker = &m
	}
	b.topics.mu.Lock()
	if _, ok := b.topics.get(name); !ok {
		b.topics.mu.Unlock()
		// Still remove any messages left by a half-finished delete.
		return b.store.DeleteTopicLogged(name, marker)
	}
	if err := b.store.DeleteTopicLogged(name, marker); err != nil {
		b.topics.mu.Unlock()
		return fmt.Errorf("broker: delete topic %s: %w", name, err)
	}
	b.topics.publishLocked(func(m map[string]TopicConfig) { delete(m, name) }, b.now().UnixMilli())
	b.topics.mu.Unlock()
	b.log.Info("broker: topic deleted", "topic", name)
	b.triggerRegister()
	return nil
}

// groupTable holds the subscription group configs (copy on write, as
// topicTable).
type groupTable struct {
	mu sync.Mutex
	m  atomic.Pointer[map[string]GroupConfig]
}

func (g *groupTable) init() {
	m := map[string]GroupConfig{}
	g.m.Store(&m)
}

func (b *Broker) loadGroups() error {
	all, err := b.store.GroupConfigs()
	if err != nil {
		return fmt.Errorf("broker: load groups: %w", err)
	}
	m := make(map[string]GroupConfig, len(all))
	for name, v := range all {
		var gc GroupConfig
		if err := json.Unmarshal(v, &gc); err != nil || gc.GroupName != name {
			return fmt.Errorf("broker: stored config of group %q is corrupt: %v", name, err)
		}
		m[name] = gc
	}
	b.groups.m.Store(&m)
	return nil
}

// groupConfig returns a subscription group's config; with autoCreate (and
// group auto-creation enabled) an unknown, validly named group is created
// with the Java defaults and persisted.
func (b *Broker) groupConfig(name string, autoCreate bool) (GroupConfig, bool) {
	if gc, ok := (*b.groups.m.Load())[name]; ok {
		return gc, true
	}
	if !autoCreate || !b.cfg.autoCreateGroups || validateName(name, maxRetryTopicLen) != nil {
		return GroupConfig{}, false
	}
	gc := protocol.DefaultSubscriptionGroupConfig(name)
	if err := b.putGroup(gc, true); err != nil {
		b.log.Error("broker: auto-create group failed", "group", name, "err", err)
		return GroupConfig{}, false
	}
	gc, ok := (*b.groups.m.Load())[name]
	return gc, ok
}

// putGroup persists and publishes gc; with onlyIfAbsent an existing group
// is kept.
func (b *Broker) putGroup(gc GroupConfig, onlyIfAbsent bool) error {
	if gc.Attributes == nil {
		gc.Attributes = map[string]string{}
	}
	v, err := json.Marshal(gc)
	if err != nil {
		return fmt.Errorf("broker: encode group %s: %w", gc.GroupName, err)
	}
	b.groups.mu.Lock()
	defer b.groups.mu.Unlock()
	cur := *b.groups.m.Load()
	if _, ok := cur[gc.GroupName]; ok && onlyIfAbsent {
		return nil
	}
	if err := b.store.PutGroupConfig(gc.GroupName, v); err != nil {
		return fmt.Errorf("broker: persist group %s: %w", gc.GroupName, err)
	}
	m := maps.Clone(cur)
	m[gc.GroupName] = gc
	b.groups.m.Store(&m)
	return nil
}

// deleteGroup removes a group's config and consumer offsets.
func (b *Broker) deleteGroup(name string) error {
	b.groups.mu.Lock()
	defer b.groups.mu.Unlock()
	if err := b.store.DeleteGroup(name); err != nil {
		return fmt.Errorf("broker: delete group %s: %w", name, err)
	}
	m := maps.Clone(*b.groups.m.Load())
	delete(m, name)
	b.groups.m.Store(&m)
	return nil
}

// deletionRecord is the log record of the deletion of topic name.
func (b *Broker) deletionRecord(name string) (store.PutMessage, error) {
	m := InboundMessage{Topic: haOpsTopic, Body: []byte(name), BornTimestamp: b.now().UnixMilli(), BornHost: b.host,
		Properties: string(protocol.AppendProperty(nil, propHAOp, haOpDeleteTopic)), MaxReconsumeTimes: -1}
	rec, tsPos, err := b.encodeRecord(nil, &m)
	if err != nil {
		return store.PutMessage{}, err
	}
	return store.PutMessage{Topic: haOpsTopic, Record: rec, StoreTimestampPos: tsPos}, nil
}
