//go:build unix && !linux

package remoting

// socketUnsent returns 0: this system's send-queue size is not read, and
// only the bytes queued in the connection count towards its output bound.
func socketUnsent(uintptr) int { return 0 }
