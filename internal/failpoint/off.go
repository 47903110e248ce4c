//go:build !failpoints

package failpoint

// Enabled reports whether failpoints are compiled in (the failpoints build
// tag).
const Enabled = false
