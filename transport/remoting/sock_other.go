//go:build !unix

package remoting

import "net"

// frameWaitSupported is false: the reader holds its buffer while a frame
// arrives.
const frameWaitSupported = false

// sock is unused off unix: every connection uses its writer goroutine and
// keeps its read buffer.
type sock struct{}

func newSock(net.Conn) *sock { return nil }

func (*sock) write([]byte) (int, error) { return 0, nil }

func (*sock) waitReadable() error { return nil }

func (*sock) unsent() int { return 0 }

func (*sock) queued() int { return -1 }

func (*sock) waitQueued(int) error { return nil }
