//go:build !failpoints

package interop

import (
	"github.com/runnel-dev/runnel/internal/failpoint"
	"github.com/runnel-dev/runnel/pipeline"
	mqsink "github.com/runnel-dev/runnel/sink/rocketmq"
)

// Without the failpoints build tag there are no failpoint options: these
// add nothing, and the tests that need them skip (requireFailpoints).

func txFaults(failpoint.Tx) []mqsink.TxOption { return nil }

func phaseHook(func(mqsink.Phase, uint64)) []mqsink.TxOption { return nil }

func scaleoutFaults(failpoint.Scaleout) []pipeline.JobOption { return nil }
