// Package invariants provides expensive self-checks that run only in builds
// with the "invariants" tag (make test uses it), as pebble does.
//
// Code guards checks with invariants.Enabled so that they compile away in
// production builds, and uses Sometimes to take rarely exercised paths
// (flush early, split a batch) often enough in tests to be covered.
package invariants

import "math/rand/v2"

// Sometimes returns true percent% of the time in invariant builds and never
// otherwise. It is safe for concurrent use.
func Sometimes(percent int) bool {
	return Enabled && rand.IntN(100) < percent
}
