//go:build linux

package interop

import (
	"fmt"
	"syscall"
	"time"
	"unsafe"
)

// processCPU returns the CPU time (user + system, every thread, exited ones
// included) process pid has used, in nanoseconds: clock_gettime on the
// process's CPU-time clock, whose id Linux derives from the pid
// (clock_getcpuclockid(3): MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)).
// /proc/PID/stat has the same figure in 10 ms ticks only.
func processCPU(pid int) (time.Duration, error) {
	const cpuclockSched = 2
	clk := int32(^pid)<<3 | cpuclockSched
	var ts syscall.Timespec
	if _, _, e := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, uintptr(clk), uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		return 0, fmt.Errorf("clock_gettime(CPU clock of pid %d): %w", pid, e)
	}
	return time.Duration(ts.Nano()), nil
}
