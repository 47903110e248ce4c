//go:build linux

package remoting

import (
	"syscall"
	"unsafe"
)

// socketUnsent returns the bytes in the send queue of the TCP socket fd
// (SIOCOUTQ: sent but not acknowledged, plus not yet sent), or 0 when the
// ioctl fails.
func socketUnsent(fd uintptr) int {
	var n int32
	if _, _, errno := syscall.RawSyscall(syscall.SYS_IOCTL, fd, syscall.TIOCOUTQ, uintptr(unsafe.Pointer(&n))); errno != 0 {
		return 0
	}
	return int(n)
}
