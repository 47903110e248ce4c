//go:build failpoints

package rocketmq

import "github.com/runnel-dev/runnel/internal/failpoint"

// WithTxFaults enables deliberate defects of the exactly-once protocol
// (failpoints build tag only; see internal/failpoint).
func WithTxFaults(f failpoint.Tx) TxOption { return txOptionFunc(func(c *txConfig) { c.faults = f }) }

// WithPhaseHook calls fn at every Phase (failpoints build tag only). fn
// runs synchronously on the goroutine the phase names (see Phase) and must
// be safe for concurrent use; it may block (a test pausing there), which
// stalls that path.
func WithPhaseHook(fn func(p Phase, epoch uint64)) TxOption {
	return txOptionFunc(func(c *txConfig) { c.hook = fn })
}
