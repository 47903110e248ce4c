package rocketmq

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil/cputime"
	"github.com/runnel-dev/runnel/transport/client"
)

// BenchmarkExactlyOnce measures the sink alone on an embedded broker: per
// op, one record written as a half message; every 5000 records an epoch is
// pre-committed and its commit started (StartCommit), overlapping the next
// epoch's writes and waited for at the next barrier (WaitCommits), as the
// runtime does. %precommit is the share of the time spent at barriers
// (waiting for the previous commit, draining sends); cpu-ns/record is the
// process's CPU time (broker included) per record.
func BenchmarkExactlyOnce(b *testing.B) {
	cl := newCluster(b)
	cl.createTopic("eo_bench", 4)
	s, err := NewExactlyOnce(cl.c, keyedMapper("eo_bench"), WithTxGroup(TxGroup("bench", "out")))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Recover(ctx, nil); err != nil {
		b.Fatal(err)
	}
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu0 := time.Now(), cputime.Process()
	var pre time.Duration
	cp := uint64(0)
	for i := range b.N {
		if err := s.Write(ctx, keyed{Key: keys[i%len(keys)], Seq: i}); err != nil {
			b.Fatal(err)
		}
		if (i+1)%5000 == 0 || i == b.N-1 {
			cp++
			t0 := time.Now()
			if err := s.WaitCommits(ctx); err != nil {
				b.Fatal(err)
			}
			txn, err := s.PreCommit(ctx, cp)
			if err != nil {
				b.Fatal(err)
			}
			pre += time.Since(t0)
			if err := s.StartCommit(ctx, txn); err != nil {
				b.Fatal(err)
			}
		}
	}
	t0 := time.Now()
	if err := s.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	last := time.Since(t0)
	b.StopTimer()
	el, cpu := time.Since(start), cputime.Process()-cpu0
	b.ReportMetric(float64(b.N)/el.Seconds(), "records/s")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/record")
	b.ReportMetric(pre.Seconds()/el.Seconds()*100, "%precommit")
	b.ReportMetric(last.Seconds(), "lastcommit-s")
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkExactlyOnceCommit measures the commit phase alone: per op, one
// half message ended with END_TRANSACTION commit. The records are written
// and pre-committed (epochs of 5000) before the timer starts;
// cpu-ns/record is the process's CPU time (broker included) per commit.
func BenchmarkExactlyOnceCommit(b *testing.B) {
	cl := newCluster(b)
	cl.createTopic("eo_cbench", 4)
	s, err := NewExactlyOnce(cl.c, keyedMapper("eo_cbench"), WithTxGroup(TxGroup("bench", "commit")))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Recover(ctx, nil); err != nil {
		b.Fatal(err)
	}
	var txns [][]byte
	for i := range b.N {
		if err := s.Write(ctx, keyed{Key: "k" + strconv.Itoa(i%1000), Seq: i}); err != nil {
			b.Fatal(err)
		}
		if (i+1)%5000 == 0 || i == b.N-1 {
			txn, err := s.PreCommit(ctx, uint64(len(txns)+1))
			if err != nil {
				b.Fatal(err)
			}
			txns = append(txns, txn)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu0 := time.Now(), cputime.Process()
	for _, txn := range txns {
		if err := s.Commit(ctx, txn); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	el, cpu := time.Since(start), cputime.Process()-cpu0
	b.ReportMetric(float64(b.N)/el.Seconds(), "commits/s")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/record")
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkTxnInfo summarises the description of an epoch of 100k records
// with a few retried sends, as a scale-out worker does at every checkpoint
// (jobinfo.TxnInfoer).
func BenchmarkTxnInfo(b *testing.B) {
	d := &txnDesc{checkpoint: 7, run: "run-1", epoch: 7, retried: []retriedSlot{{slot: 10, try: 2}, {slot: 99, try: 3}}}
	for i := range 100_000 {
		d.handles = append(d.handles, txnHandle{lane: uint32(i % 16), h: client.TxHandle{
			ProducerGroup: "runnel_tx_etl_sink", Topic: "orders-out", BrokerName: "broker-a", BrokerAddr: "127.0.0.1:10911",
			TranStateTableOffset: int64(i), CommitLogOffset: int64(i) * 700, MsgID: fmt.Sprintf("7F0000010D2C1B2F3A4C5D6E%08X", i),
		}})
	}
	raw := appendTxn(nil, d)
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := txnInfo(raw); err != nil {
			b.Fatal(err)
		}
	}
}
