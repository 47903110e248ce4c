package interop

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"
)

// BenchmarkBrokerProduceSplit is BenchmarkBrokerProduce's 128-byte rows
// (64 sends in flight) with the broker in a `runnel broker` child process
// instead of this one, so that the client's CPU and the broker's are
// measured apart: cpu-us/msg is this process's CPU per message (the client
// alone), broker-cpu-us/msg the child's (from /proc, 10 ms ticks), and
// cores-at-50k what both together would need to carry 50,000 messages per
// second. impl=official is the official producer's SendAsync,
// impl=runnel runnel's raw remoting.Conn, as in BenchmarkBrokerProduce.
// Linux only.
func BenchmarkBrokerProduceSplit(b *testing.B) {
	if runtime.GOOS != "linux" {
		b.Skip("reads the broker's CPU time from /proc")
	}
	bin := buildRunnel(b, b.TempDir())
	for _, flush := range []string{"async", "sync"} {
		b.Run("size=128/flush="+flush, func(b *testing.B) {
			p := startBrokerProcFlush(b, bin, filepath.Join(b.TempDir(), "data"), flush)
			env := &brokerEnv{nsAddr: p.nsAddr, addr: p.addr}
			topic := benchTopic(b, env, "BenchSplit")
			body := make([]byte, 128)
			pid := p.cmd.Process.Pid
			for _, impl := range []struct {
				name    string
				produce func(*testing.B, *brokerEnv, string, []byte)
			}{{"runnel", produceRunnel}, {"official", produceOfficial}} {
				b.Run("impl="+impl.name, func(b *testing.B) {
					before := procCPU(b, pid)
					impl.produce(b, env, topic, body)
					broker := procCPU(b, pid) - before
					us := float64(broker) / float64(time.Microsecond) / float64(b.N)
					b.ReportMetric(us, "broker-cpu-us/msg")
				})
			}
		})
	}
}

// procCPU returns the user + system CPU time process pid has used, from
// /proc/PID/stat (in USER_HZ ticks of 10 ms).
func procCPU(tb testing.TB, pid int) time.Duration {
	tb.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	// The command name (field 2) is parenthesised and may hold spaces: the
	// fields counted here start after its closing parenthesis, at field 3.
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		tb.Fatalf("/proc/%d/stat: no command name in %q", pid, raw)
	}
	f := bytes.Fields(raw[i+1:])
	const utime, stime = 14 - 3, 15 - 3
	if len(f) <= stime {
		tb.Fatalf("/proc/%d/stat: %d fields after the command name", pid, len(f))
	}
	var ticks int64
	for _, j := range []int{utime, stime} {
		n, err := strconv.ParseInt(string(f[j]), 10, 64)
		if err != nil {
			tb.Fatalf("/proc/%d/stat field %d: %v", pid, j+3, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * (time.Second / 100)
}
