package broker

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Retention (WithRetention): the broker removes messages whose store time
// is older than the retention, queue by queue, as Apache RocketMQ removes
// commit log files older than fileReservedTime (72 h by default). A queue's
// min offset moves past them; a consumer whose offset is below it is told
// OFFSET_MOVED with the new min (its pull answer's next offset), as Java's
// broker tells one whose messages were deleted. Removal runs on the
// retention goroutine every retentionEvery, and in steps of
// retentionStep messages per queue, so that a long backlog (a broker
// restarted after days) does not hold the store's append lock, which
// TruncateBefore takes, for the whole of it.
//
// A delay-level or timer message waits for its delivery time, which may
// lie past the retention (a timer of up to WithTimerMaxDelay), and the
// broker copies it to its real topic, with a new store time, when it is
// due: those queues keep a message for the retention plus the longest
// delay they accept, so that one is removed only once it has been due for
// the whole retention.

const (
	// DefaultRetention is WithRetention's default: Apache RocketMQ's
	// fileReservedTime.
	DefaultRetention = 72 * time.Hour
	// retentionEvery is how often the retention goroutine looks for
	// expired messages.
	retentionEvery = time.Minute
	// retentionStep bounds the messages one TruncateBefore removes.
	retentionStep = 4096
)

// WithRetention sets how long the broker keeps a message, from its store
// time on the broker's clock (default DefaultRetention, 72 h; 0 keeps
// every message until its topic is deleted). See retention.go.
func WithRetention(d time.Duration) Option {
	return optionFunc(func(c *config) { c.retention = d })
}

// runRetention removes expired messages every retentionEvery until ctx
// ends (the broker's owned goroutine "retention").
func (b *Broker) runRetention(ctx context.Context) {
	tk := time.NewTicker(retentionEvery)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
		}
		n, err := b.retainOnce(ctx)
		if err != nil && ctx.Err() == nil && b.running() {
			b.log.Warn("broker: removing expired messages failed; retrying next round", "removed", n, "err", err)
		} else if n > 0 {
			b.log.Info("broker: removed expired messages", "removed", n, "retention", b.cfg.retention)
		}
	}
}

// retainOnce removes the messages stored before now minus the retention
// (minus the longest delay too, in the delay-level and timer queues), and
// returns how many it removed.
func (b *Broker) retainOnce(ctx context.Context) (int64, error) {
	if b.cfg.retention <= 0 {
		return 0, nil
	}
	now := b.now()
	cutoff := now.Add(-b.cfg.retention).UnixMilli()
	var maxLevel time.Duration
	for _, d := range b.cfg.sub.delayLevels {
		maxLevel = max(maxLevel, d)
	}
	topics, err := b.store.Topics()
	if err != nil {
		return 0, fmt.Errorf("list topics: %w", err)
	}
	var removed int64
	var errs error
	for _, topic := range topics {
		before := cutoff
		switch topic {
		case topicSchedule:
			before = now.Add(-b.cfg.retention - maxLevel).UnixMilli()
		case timerTopic:
			before = now.Add(-b.cfg.retention - b.cfg.sub.timerMaxDelay).UnixMilli()
		}
		ids, err := b.store.QueueIDs(topic)
		if err != nil {
			errs = errors.Join(errs, fmt.Errorf("queues of %s: %w", topic, err))
			continue
		}
		for _, q := range ids {
			n, err := b.retainQueue(ctx, topic, q, before)
			removed += n
			if err != nil {
				errs = errors.Join(errs, fmt.Errorf("%s/%d: %w", topic, q, err))
			}
			if ctx.Err() != nil {
				return removed, errors.Join(errs, ctx.Err())
			}
		}
	}
	return removed, errs
}

// retainQueue removes the queue's messages stored before cutoff (Unix ms),
// retentionStep at a time.
func (b *Broker) retainQueue(ctx context.Context, topic string, q int32, cutoff int64) (int64, error) {
	keep, err := b.store.SearchOffset(topic, q, cutoff, false) // first message stored at or after cutoff
	if err != nil {
		return 0, err
	}
	var removed int64
	for ctx.Err() == nil {
		from, err := b.store.MinOffset(topic, q)
		if err != nil || from >= keep {
			return removed, err
		}
		to := min(keep, from+retentionStep)
		if err := b.store.TruncateBefore(topic, q, to); err != nil {
			return removed, err
		}
		removed += to - from
	}
	return removed, nil
}
