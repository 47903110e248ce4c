// Package cputime reads the CPU time the current process has used, for
// benchmarks that report CPU per operation next to wall time: on a shared
// machine, CPU per record varies far less with the load than records/s.
// It has no dependencies, so in-package tests of any runnel package
// (transport/remoting, the broker's store…) can import it.
package cputime

import "time"

// Process returns the CPU time (user + system) this process has used so
// far, or 0 where the platform cannot tell (see Supported).
func Process() time.Duration { return process() }

// Supported reports whether Process measures anything on this platform.
func Supported() bool { return supported }
