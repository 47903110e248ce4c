package state

import (
	"syscall"
	"time"
)

// threadCPU returns the CPU time the calling thread has used (the caller
// locks its goroutine to the thread), or 0 where that cannot be read.
func threadCPU() time.Duration {
	const rusageThread = 1 // RUSAGE_THREAD
	var ru syscall.Rusage
	if syscall.Getrusage(rusageThread, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
