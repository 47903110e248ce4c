//go:build linux

package remoting

import (
	"syscall"
	"unsafe"
)

// frameWaitSupported tells whether the reader can wait, without a read
// buffer, for the rest of a frame to be queued (socketQueued and
// socketSetLowat work here).
const frameWaitSupported = true

// socketQueued returns the bytes in the receive queue of the TCP socket
// fd (SIOCINQ), or -1 when the ioctl fails.
func socketQueued(fd uintptr) int {
	var n int32
	if _, _, errno := syscall.RawSyscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&n))); errno != 0 {
		return -1
	}
	return int(n)
}

// socketSetLowat sets the socket's receive low-water mark: the poller
// reports it readable only once n bytes are queued (or its peer closed
// it, or it failed).
func socketSetLowat(fd uintptr, n int) error {
	return syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, n)
}
