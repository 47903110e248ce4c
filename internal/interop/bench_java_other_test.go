//go:build !linux

package interop

import (
	"errors"
	"time"
)

// processCPU is Linux-only (the Java-peer benchmarks skip elsewhere).
func processCPU(int) (time.Duration, error) {
	return 0, errors.New("another process's CPU time is read on Linux only")
}
