//go:build race

package interop

// raceEnabled reports a -race build.
const raceEnabled = true
