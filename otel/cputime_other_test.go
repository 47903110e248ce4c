//go:build !unix

package otel_test

import "time"

// processCPU returns 0: the benchmark reports no CPU figures here.
func processCPU() time.Duration { return 0 }
