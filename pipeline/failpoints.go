//go:build failpoints

package pipeline

import "github.com/runnel-dev/runnel/internal/failpoint"

// InjectFaults enables deliberate checkpoint defects (failpoints build tag
// only; see internal/failpoint).
func InjectFaults(f failpoint.Pipeline) JobOption {
	return jobOptionFunc(func(c *jobConfig) { c.faults = f })
}

// InjectScaleoutFaults enables deliberate defects of RunWorker's protocol
// (failpoints build tag only; see internal/failpoint).
func InjectScaleoutFaults(f failpoint.Scaleout) JobOption {
	return jobOptionFunc(func(c *jobConfig) { c.scaleFaults = f })
}
