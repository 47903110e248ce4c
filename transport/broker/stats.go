package broker

import "sync/atomic"

// Stats are the broker's activity counters and gauges, for metrics (package
// otel reads them as observable instruments). Counters only grow while the
// broker runs.
type Stats struct {
	// SendRequests counts send requests (single messages or batches)
	// accepted for processing; SendBytes their request body bytes.
	SendRequests, SendBytes int64
	// PullRequests counts pull requests; PulledMessages the messages
	// returned by them.
	PullRequests, PulledMessages int64
	// LongPollWaiters is the number of pulls parked by long polling now.
	LongPollWaiters int64
	// ConsumerGroups is the number of subscription groups the broker knows.
	ConsumerGroups int64
}

// brokerStats are the counters behind Stats.
type brokerStats struct {
	sends, sendBytes  atomic.Int64
	pulls, pulledMsgs atomic.Int64
	// puts counts the messages the send path accepted (a batch's on
	// success), for the put rate of GET_BROKER_RUNTIME_INFO.
	puts atomic.Int64
}

func (s *brokerStats) sent(bytes int) {
	s.sends.Add(1)
	s.sendBytes.Add(int64(bytes))
}

// Stats returns a snapshot of the broker's counters. It is safe for
// concurrent use and cheap (atomic loads).
func (b *Broker) Stats() Stats {
	st := Stats{
		SendRequests:   b.stats.sends.Load(),
		SendBytes:      b.stats.sendBytes.Load(),
		PullRequests:   b.stats.pulls.Load(),
		PulledMessages: b.stats.pulledMsgs.Load(),
	}
	if b.lp != nil {
		st.LongPollWaiters = b.lp.count.Load()
	}
	if m := b.groups.m.Load(); m != nil {
		st.ConsumerGroups = int64(len(*m))
	}
	return st
}
