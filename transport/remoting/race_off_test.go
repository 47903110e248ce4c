//go:build !race

package remoting

// raceEnabled reports a -race build, whose instrumentation slows every
// goroutine several times over; latency bounds in tests scale with it.
const raceEnabled = false
