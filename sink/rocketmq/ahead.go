package rocketmq

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/runnel-dev/runnel/internal/backoff"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// The restore-point check (sink.RestoreChecker). A job restored from a
// retained checkpoint or savepoint that is older than its latest replays
// the records since that point: if the sink already committed their
// output, the replay would commit it again. Every committed message of the
// sink carries its producer group (PGROUP, kept by the broker on the
// committed copy) and its epoch (PropEpoch), and epochs only grow, so the
// check reads the output queues from before the point and fails when a
// message of this sink's group has an epoch past the point's transactions
// (and is none of the half messages the point lists, which the restore
// commits).
//
// Where it reads: every queue of the output topics (those of the point's
// transactions, plus WithOutputTopics), from the transaction's floor when
// it has one, else from the first message stored a minute before the point
// was taken (SEARCH_OFFSET_BY_TIMESTAMP; the minute absorbs clock skew
// between the job and the broker), up to the queue's max offset now. It
// sees what was committed when it runs: the job the point came from must be
// stopped.

// restoreSkew is how far before the point's time an output queue is read
// when the point has no floor for it.
const restoreSkew = time.Minute

// WithOutputTopics names the topics the sink writes to, for the restore
// check (see CheckRestore): without it the check reads only the topics of
// the restored checkpoint's transactions, and fails when those wrote
// nothing.
func WithOutputTopics(topics ...string) TxOption {
	return txOptionFunc(func(c *txConfig) { c.outputTopics = append(c.outputTopics, topics...) })
}

// CheckRestore implements sink.RestoreChecker: it fails with
// sink.ErrOutputAhead when the output topics hold committed records of
// this sink written after the restore point (see the comment in ahead.go),
// naming how many, their epochs and the first one's queue and offset.
func (s *ExactlyOnce[T]) CheckRestore(ctx context.Context, p sink.RestorePoint) error {
	return s.e.checkRestore(ctx, p)
}

func (e *txEngine) checkRestore(ctx context.Context, p sink.RestorePoint) error {
	if err := e.usable(); err != nil {
		return err
	}
	// Epochs up to the point's transaction's are its own or older. (The
	// point always lists the sink's transaction, possibly empty; epochs
	// can lag checkpoint ids after a restore, so its epoch decides.)
	limit, haveDesc := p.CheckpointID, false
	listed := map[string]bool{}
	floors := map[queueKey]int64{}
	topics := slices.Clone(e.cfg.outputTopics)
	for _, b := range p.Pending {
		d, err := decodeTxn(b)
		if err != nil {
			return err
		}
		if !haveDesc || d.epoch > limit {
			limit, haveDesc = d.epoch, true
		}
		for i := range d.handles {
			listed[d.handles[i].h.MsgID] = true
		}
		for k, f := range d.floors {
			if old, ok := floors[k]; !ok || f < old {
				floors[k] = f
			}
			topics = append(topics, k.topic)
		}
	}
	slices.Sort(topics)
	topics = slices.Compact(topics)
	if len(topics) == 0 {
		return fmt.Errorf("rocketmq sink %s: restore check of checkpoint %d: no output topic known (the sink wrote nothing up to that point): name them with WithOutputTopics", e.group, p.CheckpointID)
	}
	start := time.Now()
	var ahead, read int
	var first string
	epochs := [2]uint64{}
	for _, topic := range topics {
		route, err := e.c.Route(ctx, topic)
		if err != nil {
			return fmt.Errorf("rocketmq sink %s: restore check: route of %s: %w", e.group, topic, err)
		}
		for _, q := range route.SubscribeQueues() {
			from, ok := floors[queueKey{topic: q.Topic, broker: q.BrokerName, queue: q.QueueID}]
			if !ok {
				from, err = e.searchOffset(ctx, q, p.Time.Add(-restoreSkew))
				if err != nil {
					return err
				}
			}
			err := e.readQueue(ctx, q, from, func(m *protocol.MessageExt) {
				read++
				if g, _ := m.Property(protocol.PropProducerGroup); g != e.group {
					return
				}
				ep, err := strconv.ParseUint(propOr(m, PropEpoch), 10, 64)
				if err != nil || ep <= limit || listed[m.UniqKey()] {
					return
				}
				if ahead == 0 {
					first = fmt.Sprintf("%s offset %d (epoch %d, run %s)", q, m.QueueOffset, ep, propOr(m, PropRun))
					epochs = [2]uint64{ep, ep}
				}
				epochs = [2]uint64{min(epochs[0], ep), max(epochs[1], ep)}
				ahead++
			})
			if err != nil {
				return err
			}
		}
	}
	e.log.Info("rocketmq sink: restore check", "group", e.group, "checkpoint", p.CheckpointID, "epoch", limit,
		"topics", topics, "read", read, "ahead", ahead, "took", time.Since(start).Round(time.Millisecond))
	if ahead > 0 {
		return fmt.Errorf("%w: rocketmq sink %s: %d records of epochs %d..%d, after checkpoint %d (epoch %d), are committed in %v (first: %s); "+
			"restoring it would write them again: restore the latest checkpoint, or write to a new output topic",
			sink.ErrOutputAhead, e.group, ahead, epochs[0], epochs[1], p.CheckpointID, limit, topics, first)
	}
	return nil
}

func propOr(m *protocol.MessageExt, k string) string { v, _ := m.Property(k); return v }

func (e *txEngine) searchOffset(ctx context.Context, q protocol.MessageQueue, t time.Time) (int64, error) {
	var off int64
	err := backoff.Retry(ctx, e.cfg.retry, e.cfg.attempts, nil, func(int) error {
		actx, cancel := attemptCtx(ctx, e.lanes.timeout)
		defer cancel()
		var err error
		off, err = e.c.SearchOffset(actx, q, t)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("rocketmq sink %s: restore check: offset of %s at %s: %w", e.group, q, t.Format(time.RFC3339), err)
	}
	return off, nil
}

// readQueue calls fn for every message of q from from up to its max
// offset now.
func (e *txEngine) readQueue(ctx context.Context, q protocol.MessageQueue, from int64, fn func(*protocol.MessageExt)) error {
	var end int64
	err := backoff.Retry(ctx, e.cfg.retry, e.cfg.attempts, nil, func(int) error {
		actx, cancel := attemptCtx(ctx, e.lanes.timeout)
		defer cancel()
		var err error
		end, err = e.c.MaxOffset(actx, q)
		return err
	})
	if err != nil {
		return fmt.Errorf("rocketmq sink %s: restore check: max offset of %s: %w", e.group, q, err)
	}
	for off := from; off < end; {
		var res *client.PullResult
		err := backoff.Retry(ctx, e.cfg.retry, e.cfg.attempts, nil, func(int) error {
			actx, cancel := attemptCtx(ctx, e.lanes.timeout)
			defer cancel()
			var err error
			res, err = e.c.Pull(actx, client.PullRequest{Queue: q, Offset: off, Group: e.group, MaxMsgs: scanPullMsgs})
			if err == nil && res.Status == client.PullNoNewMsg {
				return fmt.Errorf("no message at %d of %d yet", off, end)
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("rocketmq sink %s: restore check: reading %s at %d: %w", e.group, q, off, err)
		}
		for i := range res.Messages {
			fn(&res.Messages[i])
		}
		if res.NextBeginOffset <= off {
			return fmt.Errorf("rocketmq sink %s: restore check: reading %s at %d made no progress (%s)", e.group, q, off, res.Status)
		}
		off = res.NextBeginOffset
	}
	return nil
}
