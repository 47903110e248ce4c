package rocketmq

import (
	"context"
	"fmt"
	"time"

	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// seekWindow is how many messages one read around a broker's
// timestamp answer covers.
const seekWindow = 32

// atTimestamp returns the offset of q's first message stored at or after t
// (its max offset when there is none), which AtTimestamp promises.
//
// SEARCH_OFFSET_BY_TIMESTAMP does not give it on every broker: Apache
// RocketMQ 4.x answers with the offset of the message whose store time is
// closest to t, earlier or later (ConsumeQueue.getOffsetInQueueByTime), and
// with any one of several messages stored in the same millisecond; 5.x
// answers with the lower boundary. So the answer is checked against the
// store times around it and moved: forward past messages stored before t,
// back over messages stored at or after t. A queue's store times never
// decrease (the broker stamps messages in commit log order).
func (s *Source) atTimestamp(ctx context.Context, q protocol.MessageQueue, t time.Time) (int64, error) {
	off, err := s.c.SearchOffset(ctx, q, t)
	if err != nil {
		return 0, err
	}
	lo, err := s.c.MinOffset(ctx, q)
	if err != nil {
		return 0, err
	}
	hi, err := s.c.MaxOffset(ctx, q)
	if err != nil {
		return 0, err
	}
	off = min(max(off, lo), hi)
	ms := t.UnixMilli()
	// Forward: the answer may be the last message stored before t.
	for off < hi {
		msgs, next, err := s.readAt(ctx, q, off)
		if err != nil {
			return 0, err
		}
		i := 0
		for i < len(msgs) && msgs[i].StoreTimestamp < ms {
			i++
		}
		if i < len(msgs) {
			off = msgs[i].QueueOffset
			break
		}
		off = next
	}
	// Backward: earlier messages may be stored at or after t too.
	for off > lo {
		from := max(off-seekWindow, lo)
		msgs, _, err := s.readAt(ctx, q, from)
		if err != nil {
			return 0, err
		}
		first := off // first message at or after t in [from, off)
		for i := len(msgs) - 1; i >= 0; i-- {
			if m := &msgs[i]; m.QueueOffset < off {
				if m.StoreTimestamp < ms {
					break
				}
				first = m.QueueOffset
			}
		}
		if first != from || first == off {
			off = first
			break
		}
		off = first // the whole window is at or after t: look further back
	}
	return off, nil
}

// readAt reads up to seekWindow messages of q from off, returning them and
// the offset after them.
func (s *Source) readAt(ctx context.Context, q protocol.MessageQueue, off int64) ([]protocol.MessageExt, int64, error) {
	res, err := s.c.Pull(ctx, client.PullRequest{Queue: q, Offset: off, MaxMsgs: seekWindow, Group: s.cfg.group})
	if err != nil {
		return nil, 0, err
	}
	switch res.Status {
	case client.PullFound, client.PullNoMatchedMsg:
		if res.NextBeginOffset <= off {
			return nil, 0, fmt.Errorf("reading %s at %d made no progress", q, off)
		}
		return res.Messages, res.NextBeginOffset, nil
	case client.PullOffsetIllegal:
		if res.NextBeginOffset > off {
			return nil, res.NextBeginOffset, nil
		}
	}
	return nil, 0, fmt.Errorf("reading %s at %d: %s", q, off, res.Status)
}
