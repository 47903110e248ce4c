package broker

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"time"

	"github.com/runnel-dev/runnel/transport/broker/internal/store"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// Delayed delivery (protocol §7.2).
//
// Delay levels: a message with DELAY=n (n > 0) is stored in queue n-1 of
// SCHEDULE_TOPIC_XXXX with REAL_TOPIC/REAL_QID; it is due at its store time
// plus the level's delay. Because every message of a level has the same
// delay, each level's queue is due in offset order, and the scheduler keeps
// one number per level: the next offset to deliver, persisted in store
// meta.
//
// Timer messages: TIMER_DELAY_SEC, TIMER_DELAY_MS or TIMER_DELIVER_MS give
// a deliver time (rounded down to the timer precision, at most the timer's
// max delay ahead, else MESSAGE_ILLEGAL). The message is stored in queue 0
// of rmq_sys_wheel_timer with TIMER_OUT_MS and REAL_TOPIC/REAL_QID. The
// scheduler indexes that queue in order into store meta keys ordered by
// deliver time (timer/due/<deliverMs><queueOffset> → physical offset),
// persisting how far it indexed, and delivers index entries that are due,
// deleting each entry after its delivery.
//
// Delivery re-stores the message (storeInternal) in REAL_TOPIC/REAL_QID with
// DELAY and TIMER_* removed, REAL_* kept, and the property
// SCHEDULED_FROM_OFFSET set to the physical offset of the scheduled copy.
//
// # Crash safety
//
// The store cannot write a message and a meta key atomically, so a crash
// between a delivery and the progress write that follows it would deliver
// again after the restart (RocketMQ is at-least-once here). runnel closes
// that window. Level progress is written after each batch of at most
// scheduleBatch messages, so the messages that may have been delivered
// without their progress being recorded are within the first batch after
// the persisted offset; a timer entry is deleted right after its delivery,
// so at most one entry can have been delivered and not deleted, and it is
// due, so the first complete pass over the due entries after the start
// covers it. For those messages only, before delivering, the scheduler
// looks the message's UNIQ_KEY up in the real topic's key index and skips
// the delivery if a copy with the same SCHEDULED_FROM_OFFSET is already
// stored. A message without UNIQ_KEY (possible only for a retried item of a
// batch send) is delivered at least once.
//
// Timer index entries are written before the indexed offset is advanced
// and are delivered only after it was, so re-indexing after a crash writes
// the same keys again and never resurrects a delivered entry.

const (
	// timerTopic holds timer messages until they are due (Java
	// TimerMessageStore.TIMER_TOPIC).
	timerTopic = "rmq_sys_wheel_timer"
	// propScheduledFrom marks a delivered message with the physical
	// offset of its scheduled copy, for duplicate detection after a crash.
	propScheduledFrom = "SCHEDULED_FROM_OFFSET"
	// scheduleBatch is how many messages a level or the timer index
	// handles per step (and per progress write).
	scheduleBatch = 32
)

// Meta keys of the scheduler's durable state.
const (
	metaLevelPrefix  = "sched/level/" // + uint32 BE level index → next offset (int64 BE)
	metaTimerIndexed = "timer/indexed"
	metaTimerDue     = "timer/due/" // + deliverMs (uint64 BE) + queue offset (uint64 BE) → phys (int64 BE)
)

// defaultDelayLevels returns RocketMQ's messageDelayLevel.
func defaultDelayLevels() []time.Duration {
	s, m, h := time.Second, time.Minute, time.Hour
	return []time.Duration{1 * s, 5 * s, 10 * s, 30 * s, 1 * m, 2 * m, 3 * m, 4 * m, 5 * m, 6 * m,
		7 * m, 8 * m, 9 * m, 10 * m, 20 * m, 30 * m, 1 * h, 2 * h}
}

// scheduler delays messages by level and by timer. rewrite runs on send
// goroutines and only reads configuration; everything else runs on the run
// goroutine, which owns the progress fields.
type scheduler struct {
	b              *Broker
	log            *slog.Logger
	levels         []time.Duration
	tick           time.Duration
	timerMaxDelay  time.Duration
	timerPrecision time.Duration

	// Owned by run.
	progress     []int64 // per level: next schedule-queue offset to deliver
	verifyBelow  []int64 // per level: verify deliveries below this offset
	timerIndexed int64   // next timer-queue offset to index
	verifyTimer  bool    // verify until the first complete pass over due timers
}

func newScheduler(b *Broker, cfg *subsystemConfig) *scheduler {
	return &scheduler{
		b:              b,
		log:            b.logger(),
		levels:         cfg.delayLevels,
		tick:           cfg.scheduleTick,
		timerMaxDelay:  cfg.timerMaxDelay,
		timerPrecision: cfg.timerPrecision,
	}
}

// ---- send path ----

// isPrepared reports a transactional half message, which is never delayed
// when it arrives (Java applies delays only to normal and committed ones).
func isPrepared(m *InboundMessage) bool {
	return protocol.TransactionType(m.SysFlag) == protocol.SysFlagTransactionPrepared
}

// rewrite turns a message with DELAY > 0 or a timer property into its
// scheduled form. A message with neither is left alone, without
// allocating.
func (s *scheduler) rewrite(ctx context.Context, m *InboundMessage) error {
	if m.Topic == timerTopic {
		return &protocol.Error{Code: protocol.ResNoPermission, Remark: "sending message to topic[" + timerTopic + "] is forbidden"}
	}
	if isPrepared(m) {
		return nil
	}
	var delay string
	hasTimer := false
	protocol.RangeProperties(m.Properties, func(name, value string) bool {
		switch name {
		case protocol.PropDelayLevel:
			delay = value
		case protocol.PropTimerDelaySec, protocol.PropTimerDelayMS, protocol.PropTimerDeliverMS:
			hasTimer = true
		}
		return true
	})
	if delay != "" {
		if level, err := strconv.Atoi(delay); err == nil && level > 0 {
			if hasTimer {
				m.DeleteProperties(protocol.PropTimerDelaySec, protocol.PropTimerDelayMS, protocol.PropTimerDeliverMS)
			}
			s.toLevel(m, level)
			return nil
		}
	}
	if !hasTimer {
		return nil
	}
	return s.toTimer(ctx, m)
}

// toLevel moves m to its delay level's schedule queue: DELAY (clamped to
// the last level), REAL_TOPIC and REAL_QID are set in one rebuild of the
// properties.
func (s *scheduler) toLevel(m *InboundMessage, level int) {
	level = min(level, len(s.levels))
	m.Properties = scheduledProps(m, protocol.PropDelayLevel, int64(level))
	m.Topic, m.QueueID, m.DelayLevel = topicSchedule, int32(level-1), int32(level)
}

// scheduledProps returns m's properties with REAL_TOPIC = m.Topic,
// REAL_QID = m.QueueID and key = v set (earlier values replaced), built
// with one buffer.
func scheduledProps(m *InboundMessage, key string, v int64) string {
	b := make([]byte, 0, len(m.Properties)+len(m.Topic)+len(key)+48)
	b = protocol.AppendPropertiesExcept(b, m.Properties, protocol.PropRealTopic, protocol.PropRealQueueID, key)
	b = protocol.AppendProperty(b, protocol.PropRealTopic, m.Topic)
	b = appendIntProperty(b, protocol.PropRealQueueID, int64(m.QueueID))
	b = appendIntProperty(b, key, v)
	return string(b)
}

func appendIntProperty(dst []byte, name string, v int64) []byte {
	dst = append(dst, name...)
	dst = append(dst, protocol.PropNameValueSeparator)
	dst = strconv.AppendInt(dst, v, 10)
	return append(dst, protocol.PropSeparator)
}

// timerDeliverMs computes a timer message's deliver time (Java order:
// TIMER_DELAY_SEC, then TIMER_DELAY_MS, then TIMER_DELIVER_MS).
func timerDeliverMs(m *InboundMessage, nowMs int64) (int64, error) {
	parse := func(key string) (int64, bool, error) {
		v, ok := m.Property(key)
		if !ok {
			return 0, false, nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, true, fmt.Errorf("timer property %s=%q is not a number", key, v)
		}
		return n, true, nil
	}
	if sec, ok, err := parse(protocol.PropTimerDelaySec); ok || err != nil {
		if err != nil {
			return 0, err
		}
		if sec > math.MaxInt64/2000 || sec < -math.MaxInt64/2000 {
			return 0, fmt.Errorf("timer delay of %d s out of range", sec)
		}
		return nowMs + sec*1000, nil
	}
	if ms, ok, err := parse(protocol.PropTimerDelayMS); ok || err != nil {
		if err != nil {
			return 0, err
		}
		if ms > math.MaxInt64/2 || ms < -math.MaxInt64/2 {
			return 0, fmt.Errorf("timer delay of %d ms out of range", ms)
		}
		return nowMs + ms, nil
	}
	at, _, err := parse(protocol.PropTimerDeliverMS)
	return at, err
}

// toTimer moves m to the timer topic, or leaves it alone when its deliver
// time has passed.
func (s *scheduler) toTimer(ctx context.Context, m *InboundMessage) error {
	now := s.b.now().UnixMilli()
	at, err := timerDeliverMs(m, now)
	if err != nil {
		return &protocol.Error{Code: protocol.ResMessageIllegal, Remark: err.Error()}
	}
	if at <= now {
		return nil // due already: store it as a normal message
	}
	if at-now > s.timerMaxDelay.Milliseconds() {
		return &protocol.Error{Code: protocol.ResMessageIllegal,
			Remark: fmt.Sprintf("timer message delay of %d ms exceeds the maximum of %v", at-now, s.timerMaxDelay)}
	}
	if p := s.timerPrecision.Milliseconds(); p > 1 {
		at -= at % p
	}
	if _, err := s.b.ensureTopic(ctx, timerTopic, 1, protocol.PermRead|protocol.PermWrite); err != nil {
		return &protocol.Error{Code: protocol.ResSystemError, Remark: err.Error()}
	}
	m.Properties = scheduledProps(m, protocol.PropTimerOutMS, at)
	m.Topic, m.QueueID = timerTopic, 0
	return nil
}

// ---- delivery ----

func levelKey(i int) []byte {
	return binary.BigEndian.AppendUint32([]byte(metaLevelPrefix), uint32(i))
}

func timerDueKey(deliverMs, queueOffset int64) []byte {
	k := make([]byte, 0, len(metaTimerDue)+16)
	k = append(k, metaTimerDue...)
	k = binary.BigEndian.AppendUint64(k, uint64(max(deliverMs, 0)))
	return binary.BigEndian.AppendUint64(k, uint64(queueOffset))
}

func (s *scheduler) getMetaInt(key []byte) (int64, error) {
	v, ok, err := s.b.store.GetMeta(key)
	if err != nil || !ok {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("broker: scheduler meta %q: %d bytes, want 8", key, len(v))
	}
	return int64(binary.BigEndian.Uint64(v)), nil
}

func (s *scheduler) putMetaInt(key []byte, v int64) error {
	return s.b.store.PutMeta(key, binary.BigEndian.AppendUint64(nil, uint64(v)))
}

// load reads the persisted progress.
func (s *scheduler) load() error {
	s.progress = make([]int64, len(s.levels))
	s.verifyBelow = make([]int64, len(s.levels))
	for i := range s.levels {
		p, err := s.getMetaInt(levelKey(i))
		if err != nil {
			return err
		}
		s.progress[i], s.verifyBelow[i] = p, p+scheduleBatch
	}
	p, err := s.getMetaInt([]byte(metaTimerIndexed))
	if err != nil {
		return err
	}
	s.timerIndexed, s.verifyTimer = p, true
	return nil
}

// run delivers due messages every tick until ctx ends.
func (s *scheduler) run(ctx context.Context) {
	if s.b.isSlave() {
		return // a slave delivers nothing: its master does, and the slave copies the result
	}
	t := time.NewTicker(s.tick)
	defer t.Stop()
	loaded := false
	for {
		if !loaded {
			if err := s.load(); err != nil {
				s.log.Error("broker: scheduler cannot read its progress; retrying", "err", err)
			} else {
				loaded = true
			}
		}
		if loaded {
			if err := s.pass(ctx); err != nil && ctx.Err() == nil && s.b.running() {
				s.log.Warn("broker: scheduled delivery failed; retrying", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// pass delivers everything due now.
func (s *scheduler) pass(ctx context.Context) error {
	var errs []error
	for i := range s.levels {
		if err := s.deliverLevel(ctx, i); err != nil {
			errs = append(errs, fmt.Errorf("delay level %d: %w", i+1, err))
		}
	}
	// Timer entries are delivered only once the index is complete and its
	// progress persisted: an entry delivered (and deleted) before its
	// progress write would be re-created by the next indexing.
	if err := s.indexTimers(); err != nil {
		errs = append(errs, fmt.Errorf("timer index: %w", err))
	} else if err := s.deliverTimers(ctx); err != nil {
		errs = append(errs, fmt.Errorf("timer delivery: %w", err))
	}
	return errors.Join(errs...)
}

// readBatch returns copies of up to scheduleBatch records of topic/queue
// from offset, and the offset after the scanned range. Records that do not
// decode are logged and skipped.
func (s *scheduler) readBatch(topic string, queue int32, from int64) ([]protocol.MessageExt, int64, error) {
	var out []protocol.MessageExt
	next, err := s.b.store.Get(topic, queue, from, scheduleBatch, 0, func(rec []byte, _ int64) bool {
		m, _, err := protocol.DecodeRecord(rec)
		if err != nil {
			s.log.Error("broker: skipping undecodable scheduled record", "topic", topic, "queue", queue, "err", err)
			return false
		}
		out = append(out, m.Clone())
		return true
	})
	return out, next, err
}

// deliverLevel delivers the due messages of level index i, in batches.
func (s *scheduler) deliverLevel(ctx context.Context, i int) error {
	queue := int32(i)
	delay := s.levels[i].Milliseconds()
	for ctx.Err() == nil {
		maxOff, err := s.b.store.MaxOffset(topicSchedule, queue)
		if err != nil {
			return err
		}
		start := s.progress[i]
		if start >= maxOff {
			return nil
		}
		msgs, next, err := s.readBatch(topicSchedule, queue, start)
		if err != nil {
			return err
		}
		now := s.b.now().UnixMilli()
		progress, derr := start, error(nil)
		stopped := false
		for k := range msgs {
			m := &msgs[k]
			if m.StoreTimestamp+delay > now {
				progress, stopped = m.QueueOffset, true
				break
			}
			if derr = s.deliver(ctx, m, m.QueueOffset < s.verifyBelow[i]); derr != nil {
				progress, stopped = m.QueueOffset, true
				break
			}
			progress = m.QueueOffset + 1
		}
		if !stopped {
			progress = max(progress, next)
		}
		if progress != start {
			if err := s.putMetaInt(levelKey(i), progress); err != nil {
				return errors.Join(derr, err)
			}
			s.progress[i] = progress
		}
		if derr != nil || stopped || next == start {
			return derr
		}
	}
	return nil
}

// deliver re-stores a scheduled message in its real topic and queue. With
// verify it first checks that an earlier run did not already deliver it.
func (s *scheduler) deliver(ctx context.Context, m *protocol.MessageExt, verify bool) error {
	realTopic, ok := m.Property(protocol.PropRealTopic)
	qs, ok2 := m.Property(protocol.PropRealQueueID)
	qid, err := strconv.ParseInt(qs, 10, 32)
	if !ok || !ok2 || err != nil || qid < 0 || validateTopic(realTopic) != nil {
		s.log.Error("broker: dropping scheduled message without a valid real topic/queue",
			"topic", m.Topic, "offset", m.QueueOffset, "realTopic", realTopic, "realQueue", qs)
		return nil
	}
	phys := strconv.FormatInt(m.CommitLogOffset, 10)
	if verify {
		done, err := s.alreadyDelivered(realTopic, m, phys)
		if err != nil {
			return err
		}
		if done {
			s.log.Info("broker: scheduled message was already delivered before the restart",
				"topic", realTopic, "scheduledAt", m.CommitLogOffset)
			return nil
		}
	}
	props := protocol.AppendPropertiesExcept(make([]byte, 0, len(m.Properties)+32), m.Properties,
		protocol.PropDelayLevel, protocol.PropTimerDeliverMS, protocol.PropTimerDelaySec, protocol.PropTimerDelayMS,
		protocol.PropTimerOutMS, propScheduledFrom)
	props = protocol.AppendProperty(props, propScheduledFrom, phys)
	im := &InboundMessage{
		Topic:                     realTopic,
		QueueID:                   int32(qid),
		Flag:                      m.Flag,
		Body:                      m.Body,
		Properties:                string(props),
		SysFlag:                   m.SysFlag,
		BornTimestamp:             m.BornTimestamp,
		BornHost:                  m.BornHost,
		ReconsumeTimes:            m.ReconsumeTimes,
		MaxReconsumeTimes:         -1,
		PreparedTransactionOffset: m.PreparedTransactionOffset,
	}
	if _, err := s.b.storeInternal(ctx, im); err != nil {
		return fmt.Errorf("deliver to %s/%d: %w", realTopic, qid, err)
	}
	return nil
}

// alreadyDelivered reports whether the real topic holds a copy of m
// delivered from the scheduled record at physical offset phys.
func (s *scheduler) alreadyDelivered(realTopic string, m *protocol.MessageExt, phys string) (bool, error) {
	uk := m.UniqKey()
	if uk == "" || len(uk) > store.MaxNameLen {
		return false, nil
	}
	recs, err := s.b.store.QueryByKey(realTopic, uk, store.MaxQueryNum, m.StoreTimestamp, math.MaxInt64)
	if err != nil {
		return false, err
	}
	for _, rec := range recs {
		dm, _, err := protocol.DecodeRecord(rec)
		if err != nil {
			continue
		}
		if v, ok := dm.Property(propScheduledFrom); ok && v == phys {
			return true, nil
		}
	}
	return false, nil
}

// indexTimers adds the timer queue's new messages to the due index.
func (s *scheduler) indexTimers() error {
	for {
		maxOff, err := s.b.store.MaxOffset(timerTopic, 0)
		if err != nil {
			return err
		}
		if s.timerIndexed >= maxOff {
			return nil
		}
		msgs, next, err := s.readBatch(timerTopic, 0, s.timerIndexed)
		if err != nil {
			return err
		}
		for k := range msgs {
			m := &msgs[k]
			var at int64
			if v, ok := m.Property(protocol.PropTimerOutMS); ok {
				at, _ = strconv.ParseInt(v, 10, 64) // unparsable: due at once
			}
			if err := s.b.store.PutMeta(timerDueKey(at, m.QueueOffset),
				binary.BigEndian.AppendUint64(nil, uint64(m.CommitLogOffset))); err != nil {
				return err
			}
		}
		if next == s.timerIndexed {
			return nil
		}
		if err := s.putMetaInt([]byte(metaTimerIndexed), next); err != nil {
			return err
		}
		s.timerIndexed = next
	}
}

// deliverTimers delivers the due timer messages in deliver-time order.
func (s *scheduler) deliverTimers(ctx context.Context) error {
	type entry struct {
		key  []byte
		phys int64
	}
	for ctx.Err() == nil {
		now := s.b.now().UnixMilli()
		var due []entry
		err := s.b.store.ScanMeta([]byte(metaTimerDue), func(k, v []byte) bool {
			if len(k) != len(metaTimerDue)+16 || len(v) != 8 {
				due = append(due, entry{key: append([]byte(nil), k...), phys: -1})
				return len(due) < scheduleBatch
			}
			if int64(binary.BigEndian.Uint64(k[len(metaTimerDue):])) > now {
				return false
			}
			due = append(due, entry{key: append([]byte(nil), k...), phys: int64(binary.BigEndian.Uint64(v))})
			return len(due) < scheduleBatch
		})
		if err != nil {
			return err
		}
		verify := s.verifyTimer
		for _, e := range due {
			if e.phys >= 0 {
				m, _, err := s.b.lookupByPhysicalOffset(e.phys)
				switch {
				case errors.Is(err, store.ErrNotFound):
					s.log.Error("broker: timer message vanished from the store", "phys", e.phys)
				case err != nil:
					return err
				default:
					if err := s.deliver(ctx, &m, verify); err != nil {
						return err
					}
				}
			}
			if err := s.b.store.DeleteMeta(e.key); err != nil {
				return err
			}
		}
		if len(due) < scheduleBatch {
			// The first complete pass after start covered every entry a
			// crash could have left delivered but not deleted.
			s.verifyTimer = false
			return nil
		}
	}
	return nil
}
