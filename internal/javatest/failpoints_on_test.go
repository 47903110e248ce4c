//go:build failpoints

package javatest

import (
	"github.com/runnel-dev/runnel/internal/failpoint"
	mqsink "github.com/runnel-dev/runnel/sink/rocketmq"
)

// The failpoint options (internal/failpoint), compiled in with the
// failpoints build tag; failpoints_off_test.go has the no-op versions.

func txFaults(f failpoint.Tx) []mqsink.TxOption { return []mqsink.TxOption{mqsink.WithTxFaults(f)} }

func phaseHook(fn func(mqsink.Phase, uint64)) []mqsink.TxOption {
	return []mqsink.TxOption{mqsink.WithPhaseHook(fn)}
}
