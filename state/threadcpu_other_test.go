//go:build !linux

package state

import "time"

// threadCPU is not measured on this platform.
func threadCPU() time.Duration { return 0 }
