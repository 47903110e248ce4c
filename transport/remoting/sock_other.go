//go:build !unix

package remoting

import "net"

// sock is unused off unix: every connection uses its writer goroutine and
// keeps its read buffer.
type sock struct{}

func newSock(net.Conn) *sock { return nil }

func (*sock) write([]byte) (int, error) { return 0, nil }

func (*sock) waitReadable() error { return nil }

func (*sock) unsent() int { return 0 }
