package cputime

import (
	"testing"
	"time"
)

func TestProcessGrowsWithWork(t *testing.T) {
	if !Supported() {
		t.Skip("no process CPU time on this platform")
	}
	start := Process()
	deadline := time.Now().Add(50 * time.Millisecond)
	x := 0
	for time.Now().Before(deadline) { // burn CPU on this goroutine
		x++
	}
	used := Process() - start
	if used < 10*time.Millisecond {
		t.Fatalf("50 ms of busy work measured as %v of CPU (%d spins)", used, x)
	}
}
