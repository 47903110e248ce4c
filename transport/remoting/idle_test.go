package remoting

import (
	"runtime"
	"testing"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// TestIdleConnHeap opens 1,000 connections to a Server, has each send one
// request and read its answer, and measures the live heap they hold once
// idle: the Server's side of each (ServerConn, its reader, its queue) plus
// the test's bare net.Conn. Read and write buffers are pooled and the write
// queue grows on demand, so an idle connection must hold a few KiB, not the
// 32 KiB read buffer, 32 KiB write buffer and 64 KiB write-queue channel it
// used to (about 135 KiB); and two goroutines (its reader and the handler
// goroutine parked for its next request), the writer running only while
// frames are queued. The figures are logged.
func TestIdleConnHeap(t *testing.T) {
	const conns = 1000
	_, addr := newTestServer(t, WithMaxConnsPerIP(0))
	frame, err := echoReq(1).AppendFrame(nil, protocol.SerializeJSON)
	if err != nil {
		t.Fatal(err)
	}
	before := liveHeap()
	g0, stack0 := runtime.NumGoroutine(), stackInuse()
	ncs := dialConns(t, addr, conns)
	for _, nc := range ncs {
		if _, err := nc.Write(frame); err != nil {
			t.Fatalf("write: %v", err)
		}
		readEcho(t, nc, 1)
	}
	after := liveHeap()
	per := (float64(after) - float64(before)) / conns
	goroutines := float64(runtime.NumGoroutine()-g0) / conns
	stack := (float64(stackInuse()) - float64(stack0)) / conns
	t.Logf("live heap: %.1f MiB before, %.1f MiB with %d idle connections: %.1f KiB per connection (server side and the test's net.Conn); "+
		"%.2f goroutines and %.1f KiB of stack per connection",
		float64(before)/(1<<20), float64(after)/(1<<20), conns, per/1024, goroutines, stack/1024)
	if per > 16<<10 {
		t.Errorf("%.1f KiB of live heap per idle connection, want at most 16 KiB", per/1024)
	}
	// The reader and the handler goroutine parked for the next request;
	// the writer runs only while frames are queued.
	if goroutines > 2.05 {
		t.Errorf("%.2f goroutines per idle connection, want 2", goroutines)
	}
}

func stackInuse() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.StackInuse
}

// liveHeap returns the live heap after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
