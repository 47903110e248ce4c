package remoting

import (
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil/cputime"
)

// BenchmarkAcceptConn measures what a connection costs the server from
// accept to close: batches of connections are dialled (raw TCP), each
// either idle or having sent the first byte of a frame (a trickling
// peer), served until all are registered, then closed by the peer and
// torn down. One op is one connection; cpu-ns/conn is the whole process's
// CPU (the raw dials and closes included) per connection. log=text gives
// the server a text logger at Info (as the CLI has), log=discard none.
func BenchmarkAcceptConn(b *testing.B) {
	for _, lg := range []string{"discard", "text"} {
		for _, mode := range []string{"idle", "trickle"} {
			b.Run("log="+lg+"/peer="+mode, func(b *testing.B) {
				var opts []ServerOption
				if lg == "text" {
					opts = append(opts, WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
				}
				benchAcceptConn(b, mode == "trickle", opts...)
			})
		}
	}
}

func benchAcceptConn(b *testing.B, trickle bool, opts ...ServerOption) {
	s, addr := newTestServer(b, opts...)
	const batch = 100
	conns := make([]net.Conn, 0, batch)
	waitActive := func(n int64) {
		deadline := time.Now().Add(10 * time.Second)
		for s.Stats().Active != n {
			if time.Now().After(deadline) {
				b.Fatalf("active connections: %d, want %d", s.Stats().Active, n)
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cputime.Process()
	for done := 0; done < b.N; {
		n := min(batch, b.N-done)
		for range n {
			nc, err := net.Dial("tcp", addr)
			if err != nil {
				b.Fatal(err)
			}
			if trickle {
				if _, err := nc.Write([]byte{0}); err != nil {
					b.Fatal(err)
				}
			}
			conns = append(conns, nc)
		}
		waitActive(int64(n))
		for _, nc := range conns {
			_ = nc.Close()
		}
		conns = conns[:0]
		waitActive(0)
		done += n
	}
	cpu := cputime.Process() - cpu0
	b.StopTimer()
	if cputime.Supported() {
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/conn")
	}
}
