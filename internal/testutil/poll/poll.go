// Package poll waits in tests for a condition that becomes true
// asynchronously. It depends on the standard library only, so the tests of
// any package (those of the name server and broker included, which
// package testutil imports) may use it.
package poll

import (
	"testing"
	"time"
)

// Until calls fn every `every` until it returns nil, and fails t with fn's
// last error if that has not happened within total. fn runs at least once.
// It must be called from the test's goroutine because it may call
// t.Fatalf.
func Until(t testing.TB, total, every time.Duration, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	tick := time.NewTicker(max(every, time.Millisecond))
	defer tick.Stop()
	for {
		err := fn()
		if err == nil {
			return
		}
		if !time.Now().Before(deadline) {
			t.Fatalf("still failing after %v: %v", total, err)
			return
		}
		<-tick.C
	}
}
