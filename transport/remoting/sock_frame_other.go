//go:build unix && !linux

package remoting

// frameWaitSupported is false: on this system the reader holds its buffer
// while the rest of a frame arrives.
const frameWaitSupported = false

func socketQueued(uintptr) int { return -1 }

func socketSetLowat(uintptr, int) error { return nil }
