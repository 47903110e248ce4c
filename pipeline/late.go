package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"time"
)

// Late records: a record whose event time is behind the keyed subtask's
// watermark after everything it belonged to expired (a window operator's
// record all of whose windows fired and were cleaned up). Nothing drops
// one silently: it is counted (OperatorStats.Late, the status page), and
// goes to the function's side output (CountLate), to the operator's
// dead-letter sink, or, with no dead-letter policy, is dropped with a
// warning the first time per subtask.

// LateRecord handles v, the current record, as late: its event time
// (Timestamp) is behind the subtask's watermark and everything it belonged
// to has expired. It counts the record in the operator's late records (the
// status page's Late column, runtime.OperatorStatus.Late), then sends it to
// the operator's dead-letter sink when its error policy (OnError) is
// DeadLetter, with reason ReasonLate, and drops it otherwise, logging the
// first record a subtask drops at Warn: a late record never fails the job.
// A function that routes late records itself (to a side output) calls
// CountLate instead.
func (c *KeyedContext[K, U]) LateRecord(v any) error {
	c.out.late++
	return c.task.late(c.ctx, v, c.ts, c.wm)
}

// CountLate counts one late record that the function handled itself, for
// instance by sending it to a side output (see LateRecord).
func (c *KeyedContext[K, U]) CountLate() { c.out.late++ }

// lateHandler is a keyed subtask's handling of late records after they
// were counted. Its task's goroutine only.
type lateHandler struct {
	send   func(ctx context.Context, err error, v any, ts int64) error // nil: no dead-letter policy
	log    *slog.Logger
	uid    string
	sub    int
	logged bool
}

// newLateHandler builds the late-record handling of node n's subtask sub
// (at chain-building time: a dead-letter policy adds the task's port to
// the dead-letter sink).
func (b *chainBuilder) newLateHandler(n *node, sub int) *lateHandler {
	h := &lateHandler{log: n.job.cfg.logger, uid: n.uid, sub: sub}
	if n.policy.kind == policyDeadLetter {
		h.send = b.deadLetterer(n, n.uid, n.policy) // reasons.go
	}
	return h
}

func (h *lateHandler) handle(ctx context.Context, v any, ts, wm int64) error {
	if h.send != nil {
		return h.send(ctx, &recordError{reason: ReasonLate, err: lateError(ts, wm)}, v, ts)
	}
	if !h.logged {
		h.logged = true
		h.log.Warn("pipeline: dropped a late record (counted in the operator's late records; this is logged once per subtask): "+
			"send late records to a side output (window.LateRecords) or to a dead-letter sink (OnError(DeadLetter(…))) to keep them",
			"operator", h.uid, "subtask", h.sub, "reason", lateError(ts, wm))
	}
	return nil
}

// lateError says how late a record at ts is behind watermark wm.
func lateError(ts, wm int64) error {
	if wm == math.MinInt64 {
		return fmt.Errorf("event time %s is late", fmtNanos(ts))
	}
	return fmt.Errorf("event time %s is %s behind the watermark %s: everything it belonged to had expired",
		fmtNanos(ts), behind(ts, wm), fmtNanos(wm))
}

// behind renders wm - ts (> 0) for people.
func behind(ts, wm int64) string {
	d := time.Duration(wm - ts)
	switch {
	case d < 0: // overflowed: centuries
		return "more than 290 years"
	case d < time.Minute:
		return d.Round(time.Millisecond).String()
	case d < 48*time.Hour:
		return d.Round(time.Second).String()
	}
	return fmt.Sprintf("%d days", d/(24*time.Hour))
}

func fmtNanos(ns int64) string { return time.Unix(0, ns).UTC().Format(time.RFC3339Nano) }

// late implements keyTask.
func (kt *keyedTask[K, T, U]) late(ctx context.Context, v any, ts, wm int64) error {
	return kt.lateH.handle(ctx, v, ts, wm)
}
