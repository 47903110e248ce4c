package broker

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil/cputime"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// haBenchBody is the body size of the HA benchmarks.
const haBenchBody = 256

// BenchmarkBrokerHASend compares the send throughput of a SYNC_MASTER pair
// (each send answered once the slave has it) with a single broker, both
// with sync flush (FlushSync, the default) and a 256-byte body, 64 sends in
// flight on one connection. The slave runs in the same process, so on a
// small machine its work (receiving, storing, fsyncing, indexing) competes
// with the master's for the same cores: mode=sync-pair vs mode=single in
// one run is the comparison (target: the pair at least 70 % of the
// single broker's msgs/s).
func BenchmarkBrokerHASend(b *testing.B) {
	b.Run("mode=single", func(b *testing.B) {
		br := startBroker(b)
		benchHASend(b, br)
	})
	b.Run("mode=sync-pair", func(b *testing.B) {
		p := startPair(b, RoleSyncMaster, nil, nil)
		benchHASend(b, p.master)
		if hs := p.master.HAStatus(); hs.SyncTimeouts+hs.SlaveNotAvailable > 0 {
			b.Fatalf("%d sends answered FLUSH_SLAVE_TIMEOUT, %d SLAVE_NOT_AVAILABLE", hs.SyncTimeouts, hs.SlaveNotAvailable)
		}
	})
}

// benchHASend sends b.N messages to br, 64 in flight, and reports msgs/s
// and the process CPU time per message.
func benchHASend(b *testing.B, br *Broker) {
	c := dial(b, br.Addr())
	body := make([]byte, haBenchBody)
	p := props("TAGS", "TagA")
	createTopic(b, c, "BenchHA", 4)
	cpu0 := cputime.Process()
	b.SetBytes(haBenchBody)
	b.ReportAllocs()
	b.ResetTimer()
	if n := pipelinedSends(b, c, b.N, 64, body, p, nil); n > 0 {
		b.Fatalf("%d sends failed or were not SEND_OK", n)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	b.ReportMetric(float64(cputime.Process()-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-us/msg")
}

// pipelinedSends sends n messages on c with inFlight requests in flight,
// pacing them with pace (nil: as fast as the broker answers), and returns
// how many failed or were answered other than SEND_OK.
func pipelinedSends(tb testing.TB, c *remoting.Conn, n, inFlight int, body []byte, p string, pace func(i int)) int64 {
	return pipelinedSendsTimed(c, n, inFlight, body, p, pace, nil)
}

// pipelinedSendsTimed is pipelinedSends that records each send's round
// trip in lat (when not nil; it must hold n).
func pipelinedSendsTimed(c *remoting.Conn, n, inFlight int, body []byte, p string, pace func(i int), lat []time.Duration) int64 {
	sem := make(chan struct{}, inFlight)
	var wg sync.WaitGroup
	var failed atomic.Int64
	ctx := context.Background()
	for i := range n {
		if pace != nil {
			pace(i)
		}
		sem <- struct{}{}
		wg.Add(1)
		t0 := time.Now()
		c.InvokeAsync(ctx, sendReq("BenchHA", int32(i%4), body, p), func(resp *protocol.Command, err error) {
			if err != nil || resp.Code != protocol.ResSuccess {
				failed.Add(1)
			}
			if lat != nil {
				lat[i] = time.Since(t0)
			}
			<-sem
			wg.Done()
		})
	}
	wg.Wait()
	return failed.Load()
}

// BenchmarkBrokerHALag measures a SYNC_MASTER pair's replication lag under
// load at half the pair's maximum rate (measured first, for a second, as
// BenchmarkBrokerHASend does): the time from a log end being seen on the
// master to the slave acknowledging it, sampled every millisecond (so each
// figure is within about a millisecond), over at least 2 s of load whatever
// b.N (its ns/op means nothing). Reports the paced and maximum rates and the
// lag's p50 and p99 (target: p99 at most 50 ms), and the sends' p99 round
// trip. slave=sync-flush is runnel's default (the slave fsyncs what it
// acknowledges); slave=async-flush acknowledges what it wrote without
// waiting for the fsync, as a Java slave reports its written offset.
func BenchmarkBrokerHALag(b *testing.B) {
	b.Run("slave=sync-flush", func(b *testing.B) { benchHALag(b, FlushSync) })
	b.Run("slave=async-flush", func(b *testing.B) { benchHALag(b, FlushAsync) })
}

// benchHALag is BenchmarkBrokerHALag with the slave in flush mode
// slaveFlush (the master flushes in sync mode).
func benchHALag(b *testing.B, slaveFlush FlushMode) {
	p := startPair(b, RoleSyncMaster, nil, []Option{WithFlushMode(slaveFlush)})
	c := dial(b, p.master.Addr())
	body := make([]byte, haBenchBody)
	pr := props("TAGS", "TagA")
	createTopic(b, c, "BenchHA", 4)

	// The pair's maximum rate.
	var sent int
	start := time.Now()
	for time.Since(start) < time.Second {
		if n := pipelinedSends(b, c, 2000, 64, body, pr, nil); n > 0 {
			b.Fatalf("%d sends failed", n)
		}
		sent += 2000
	}
	maxRate := float64(sent) / time.Since(start).Seconds()
	rate := maxRate / 2

	// The lag sampler.
	m := p.master
	type seen struct {
		at  time.Time
		end int64
	}
	stop := make(chan struct{})
	var lags []time.Duration
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var pending []seen
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case now := <-t.C:
				end, ack := m.store.LogEnd(), m.master.ackMax.Load()
				if len(pending) == 0 || end > pending[len(pending)-1].end {
					pending = append(pending, seen{now, end})
				}
				n := 0
				for n < len(pending) && pending[n].end <= ack {
					lags = append(lags, now.Sub(pending[n].at))
					n++
				}
				pending = pending[n:]
			}
		}
	}()

	interval := time.Duration(float64(time.Second) / rate)
	n := max(b.N, int(2*rate)) // at least 2 s of samples, whatever b.N
	b.SetBytes(haBenchBody)
	b.ResetTimer()
	t0 := time.Now()
	lat := make([]time.Duration, n)
	failed := pipelinedSendsTimed(c, n, 1024, body, pr, func(i int) {
		if d := time.Until(t0.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
	}, lat)
	b.StopTimer()
	close(stop)
	wg.Wait()
	if failed > 0 {
		b.Fatalf("%d sends failed", failed)
	}
	if len(lags) == 0 {
		b.Fatal("no lag sample")
	}
	slices.Sort(lags)
	slices.Sort(lat)
	q := func(f float64) float64 { return quantileMS(lags, f) }
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "msgs/s")
	b.ReportMetric(maxRate, "max-msgs/s")
	b.ReportMetric(q(0.50), "lag-p50-ms")
	b.ReportMetric(q(0.99), "lag-p99-ms")
	b.ReportMetric(quantileMS(lat, 0.99), "send-p99-ms")
}

// quantileMS returns quantile f of sorted ds in milliseconds.
func quantileMS(ds []time.Duration, f float64) float64 {
	return float64(ds[min(len(ds)-1, int(f*float64(len(ds))))]) / float64(time.Millisecond)
}
