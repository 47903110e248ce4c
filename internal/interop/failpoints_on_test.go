//go:build failpoints

package interop

import (
	"github.com/runnel-dev/runnel/internal/failpoint"
	"github.com/runnel-dev/runnel/pipeline"
	mqsink "github.com/runnel-dev/runnel/sink/rocketmq"
)

// The failpoint options (internal/failpoint), compiled in with the
// failpoints build tag; failpoints_off_test.go has the no-op versions.

func txFaults(f failpoint.Tx) []mqsink.TxOption { return []mqsink.TxOption{mqsink.WithTxFaults(f)} }

func phaseHook(fn func(mqsink.Phase, uint64)) []mqsink.TxOption {
	return []mqsink.TxOption{mqsink.WithPhaseHook(fn)}
}

func scaleoutFaults(f failpoint.Scaleout) []pipeline.JobOption {
	return []pipeline.JobOption{pipeline.InjectScaleoutFaults(f)}
}
