package scaleout

// Verdict is whether a tagged message (or a sink transaction) of a task
// counts.
type Verdict uint8

const (
	// Undecided: no valid record covers the tag's epoch yet.
	Undecided Verdict = iota
	// Valid: the valid record covering the epoch has the tag's owner epoch.
	Valid
	// Invalid: another owner epoch's record covers the epoch, or a newer
	// owner epoch fenced the tag's.
	Invalid
	// Unknown: the epoch is older than the chain's owner-epoch history
	// (more than MaxHistory owner changes ago): the caller cannot decide
	// and must fail loudly rather than guess.
	Unknown
)

func (v Verdict) String() string {
	switch v {
	case Undecided:
		return "undecided"
	case Valid:
		return "valid"
	case Invalid:
		return "invalid"
	}
	return "unknown"
}

// keepSinkRecords bounds how many valid records' sink transactions a Chain
// remembers for check-back answers (the broker checks back within its
// discard window, a few minutes: at a 1 s interval that is a few hundred).
const keepSinkRecords = 2048

// Chain is the state of one task's commit chain as a reader sees it after
// applying the records of its commit queue in log order. It is not safe for
// concurrent use.
type Chain struct {
	task         string
	latest       *Record
	latestOffset int64
	maxEpoch     uint64

	sinks    map[sinkKey][]byte
	sinkRing []sinkKey // insertion order, for eviction
	anchored bool
}

type sinkKey struct {
	sink  string
	epoch uint64
}

// NewChain returns the empty chain of task.
func NewChain(task string) *Chain {
	return &Chain{task: task, latestOffset: -1, sinks: make(map[sinkKey][]byte)}
}

// Task is the chain's task.
func (c *Chain) Task() string { return c.task }

// Anchor trusts r, read at offset, as the chain's latest valid record: a
// reader that starts from a hint (an offset a writer stored after
// confirming its record) rather than from the queue's first record.
func (c *Chain) Anchor(offset int64, r *Record) {
	c.accept(offset, r)
	c.anchored = true
}

// Anchored reports whether the chain started from a trusted record (or a
// first record) rather than being empty.
func (c *Chain) Anchored() bool { return c.anchored || c.latest != nil }

// Apply processes the record read at offset, the next one of the queue in
// log order (records of other tasks are skipped by the caller), and reports
// whether it is valid. A task's first record is valid when it names no
// previous record.
func (c *Chain) Apply(offset int64, r *Record) bool {
	if r.OwnerEpoch > c.maxEpoch {
		c.maxEpoch = r.OwnerEpoch
	}
	if !c.extends(r) {
		return false
	}
	c.accept(offset, r)
	return true
}

// extends reports whether r may follow the latest valid record.
func (c *Chain) extends(r *Record) bool {
	if r.Task != c.task {
		return false
	}
	if c.latest == nil {
		return r.PrevOffset == -1 && r.PrevSeq == 0
	}
	l := c.latest
	if r.PrevOffset != c.latestOffset || r.PrevSeq != l.Seq || r.OwnerEpoch < l.OwnerEpoch {
		return false
	}
	if r.Kind == KindClaim {
		return r.OwnerEpoch > l.OwnerEpoch
	}
	return r.Seq > l.Seq
}

func (c *Chain) accept(offset int64, r *Record) {
	c.latest, c.latestOffset = r, offset
	if r.OwnerEpoch > c.maxEpoch {
		c.maxEpoch = r.OwnerEpoch
	}
	for _, s := range r.Sinks {
		k := sinkKey{s.Sink, s.Epoch}
		if _, ok := c.sinks[k]; !ok {
			c.sinkRing = append(c.sinkRing, k)
		}
		c.sinks[k] = s.Info
	}
	if over := len(c.sinkRing) - keepSinkRecords*4; over > 0 {
		for _, k := range c.sinkRing[:over] {
			delete(c.sinks, k)
		}
		c.sinkRing = append(c.sinkRing[:0], c.sinkRing[over:]...)
	}
}

// Latest returns the latest valid record and its queue offset (ok false
// when the chain has none).
func (c *Chain) Latest() (r *Record, offset int64, ok bool) {
	if c.latest == nil {
		return nil, -1, false
	}
	return c.latest, c.latestOffset, true
}

// MaxEpoch is the highest owner epoch of any record applied, valid or not: a
// new owner claims with more.
func (c *Chain) MaxEpoch() uint64 { return c.maxEpoch }

// Decide says whether what was written under (ownerEpoch, epoch) counts:
// epoch is the id of the checkpoint that completes it.
func (c *Chain) Decide(ownerEpoch, epoch uint64) Verdict {
	l := c.latest
	if l == nil {
		return Undecided
	}
	if epoch > l.Seq {
		if ownerEpoch < l.OwnerEpoch {
			return Invalid
		}
		return Undecided
	}
	h := l.History
	for i := len(h) - 1; i >= 0; i-- {
		if h[i].FromSeq <= epoch {
			if h[i].Epoch == ownerEpoch {
				return Valid
			}
			return Invalid
		}
	}
	if len(h) > 0 && len(h) < MaxHistory {
		// The history is complete (it starts at the task's first owner):
		// nothing of this task has such an early epoch.
		return Invalid
	}
	return Unknown
}

// SinkInfo returns the check-back information a valid record gave for the
// transaction of sink pre-committed for epoch (ok false when the chain does
// not remember one: the sink had no records in that epoch, or the record is
// older than the chain remembers).
func (c *Chain) SinkInfo(sink string, epoch uint64) ([]byte, bool) {
	b, ok := c.sinks[sinkKey{sink, epoch}]
	return b, ok
}

// NextHistory returns the owner-epoch history a record of ownerEpoch
// written after the latest valid record carries (bounded to MaxHistory
// transitions).
func (c *Chain) NextHistory(ownerEpoch uint64) []EpochStart {
	var h []EpochStart
	var lastSeq uint64
	if c.latest != nil {
		h = append(h, c.latest.History...)
		lastSeq = c.latest.Seq
	}
	if n := len(h); n == 0 || h[n-1].Epoch != ownerEpoch {
		h = append(h, EpochStart{Epoch: ownerEpoch, FromSeq: lastSeq + 1})
	}
	if len(h) > MaxHistory {
		h = h[len(h)-MaxHistory:]
	}
	return h
}

// clone returns a copy of c for Decide, Latest and NextHistory (records
// are never modified once applied); it remembers no sink transactions.
func (c *Chain) clone() *Chain {
	d := *c
	d.sinks, d.sinkRing = map[sinkKey][]byte{}, nil
	return &d
}
