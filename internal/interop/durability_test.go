package interop

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// envDurabilityKills overrides the number of SIGKILLs of TestDurabilityKill9.
const envDurabilityKills = "RUNNEL_DURABILITY_KILLS"

// buildRunnel builds the runnel command of the repository this module sits
// in (two directories up) into dir and returns its path.
func buildRunnel(tb testing.TB, dir string) string {
	tb.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		tb.Fatal(err)
	}
	bin := filepath.Join(dir, "runnel")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goTool(), "build", "-o", bin, "./cmd/runnel")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build ./cmd/runnel: %v\n%s", err, out)
	}
	return bin
}

// brokerProc is a running `runnel broker` child process.
type brokerProc struct {
	cmd    *exec.Cmd
	nsAddr string
	addr   string
	stderr *lockedBuffer
	done   chan struct{} // closed when the process was reaped
	err    error         // Wait's result, valid after done
}

// lockedBuffer keeps the last 64 KiB written to it.
type lockedBuffer struct {
	mu struct {
		sync.Mutex
		b []byte
	}
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.mu.b = append(l.mu.b, p...)
	if n := len(l.mu.b); n > 64<<10 {
		l.mu.b = append(l.mu.b[:0], l.mu.b[n-(64<<10):]...)
	}
	return len(p), nil
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.mu.b)
}

// startBrokerProc starts `runnel broker` on port 0 with sync flush on
// dataDir and waits for its readiness line.
func startBrokerProc(tb testing.TB, bin, dataDir string) *brokerProc {
	tb.Helper()
	return startBrokerProcFlush(tb, bin, dataDir, "sync")
}

// startBrokerProcFlush is startBrokerProc with --flush flush.
func startBrokerProcFlush(tb testing.TB, bin, dataDir, flush string) *brokerProc {
	tb.Helper()
	cmd := exec.Command(bin, "broker", "--listen", "127.0.0.1:0", "--namesrv-listen", "127.0.0.1:0",
		"--data", dataDir, "--flush", flush, "--log-level", "warn")
	p := &brokerProc{cmd: cmd, stderr: &lockedBuffer{}, done: make(chan struct{})}
	cmd.Stderr = p.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start %s: %v", bin, err)
	}
	ready := make(chan string, 1)
	// One goroutine reads stdout to EOF (the pipe must be drained before
	// Wait), then reaps the process.
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if line := sc.Text(); strings.HasPrefix(line, "runnel: ready") {
				select {
				case ready <- line:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		p.err = cmd.Wait()
		close(p.done)
	}()
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})
	select {
	case line := <-ready:
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "namesrv="); ok {
				p.nsAddr = v
			}
			if v, ok := strings.CutPrefix(f, "broker="); ok {
				p.addr = v
			}
		}
		if p.addr == "" || p.nsAddr == "" {
			tb.Fatalf("readiness line %q lacks addresses", line)
		}
	case <-p.done:
		tb.Fatalf("runnel broker exited before it was ready: %v\n%s", p.err, p.stderr)
	case <-time.After(30 * time.Second):
		tb.Fatalf("runnel broker not ready after 30 s\n%s", p.stderr)
	}
	return p
}

// kill sends SIGKILL and waits until the process is reaped; it fails the
// test if the process had exited on its own.
func (p *brokerProc) kill(tb testing.TB) {
	tb.Helper()
	select {
	case <-p.done:
		tb.Fatalf("runnel broker died before the kill: %v\n%s", p.err, p.stderr)
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		tb.Fatalf("SIGKILL: %v", err)
	}
	<-p.done
	var ee *exec.ExitError
	if !errors.As(p.err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		tb.Fatalf("runnel broker ended with %v, not by SIGKILL\n%s", p.err, p.stderr)
	}
}

// acked is what a SEND_OK acknowledged.
type acked struct {
	hash uint64
	id   string
}

type queueOffset struct {
	queue  int32
	offset int64
}

func payloadHash(b []byte) uint64 {
	h := fnv.New64a()
	_, _ = h.Write(b)
	return h.Sum64()
}

// TestDurabilityKill9 is the kill -9 proof. A `runnel broker`
// child with sync flush takes a concurrent produce load from several
// connections; at a random moment it is killed with SIGKILL and restarted
// on the same data dir (its ports change, the readiness line tells the new
// ones). After every restart each message that got SEND_OK must be
// readable at the queue offset its response named, with the same payload,
// and no acknowledged offset may ever be acknowledged again for a
// different payload. 20 kills (5 with -short; RUNNEL_DURABILITY_KILLS
// overrides).
func TestDurabilityKill9(t *testing.T) {
	t.Parallel()
	kills := 20
	if testing.Short() {
		kills = 5
	}
	if v := os.Getenv(envDurabilityKills); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive count", envDurabilityKills, v)
		}
		kills = n
	}
	tmp := t.TempDir()
	bin := buildRunnel(t, tmp)
	dataDir := filepath.Join(tmp, "data")
	const (
		topic   = "Durable"
		queues  = 4
		workers = 8
	)

	all := map[queueOffset]acked{} // every acknowledged message so far
	var sent, lost atomic.Int64
	start := time.Now()
	for cycle := 0; cycle <= kills; cycle++ {
		p := startBrokerProc(t, bin, dataDir)
		conn := dialTB(t, p.addr)
		// Everything acknowledged before is there, as acknowledged.
		verifyAcked(t, conn, topic, queues, all, cycle)
		if cycle == kills {
			break
		}

		// Load: workers send until the connection dies under them.
		type ack struct {
			qo queueOffset
			a  acked
		}
		acks := make(chan ack, 1024)
		var wg sync.WaitGroup
		ctx, cancel := context.WithCancel(context.Background())
		var loadErr atomic.Value
		for w := range workers {
			c, err := remoting.Dial(ctx, p.addr)
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				for n := 0; ctx.Err() == nil; n++ {
					id := fmt.Sprintf("c%d-w%d-%d", cycle, w, n)
					body := make([]byte, 64+rand.IntN(448))
					copy(body, id)
					for i := len(id); i < len(body); i++ {
						body[i] = byte(rand.Uint32())
					}
					req := durableSendReq(topic, int32(w%queues), body, id)
					sent.Add(1)
					resp, err := c.Invoke(ctx, req)
					if err != nil {
						lost.Add(1)
						return // killed: the outcome of this send is unknown
					}
					if resp.Code != protocol.ResSuccess {
						loadErr.Store(fmt.Errorf("send %s: code %d %s", id, resp.Code, resp.Remark))
						return
					}
					var rh protocol.SendMessageResponseHeader
					if err := rh.Decode(resp); err != nil {
						loadErr.Store(fmt.Errorf("send %s response: %w", id, err))
						return
					}
					acks <- ack{queueOffset{rh.QueueID, rh.QueueOffset}, acked{payloadHash(body), id}}
				}
			}()
		}
		collected := make(chan struct{})
		go func() {
			defer close(collected)
			for a := range acks {
				if prev, ok := all[a.qo]; ok && prev != a.a {
					t.Errorf("queue %d offset %d acknowledged for %s after it was acknowledged for %s",
						a.qo.queue, a.qo.offset, a.a.id, prev.id)
				}
				all[a.qo] = a.a
			}
		}()
		time.Sleep(time.Duration(30+rand.IntN(400)) * time.Millisecond) // a random kill point, not synchronisation
		p.kill(t)
		cancel()
		wg.Wait()
		close(acks)
		<-collected
		if err, _ := loadErr.Load().(error); err != nil {
			t.Fatalf("cycle %d: %v", cycle, err)
		}
	}
	t.Logf("%d SIGKILLs, %d sends, %d acknowledged and verified after every restart, %d without an answer at a kill, %v",
		kills, sent.Load(), len(all), lost.Load(), time.Since(start).Round(time.Millisecond))
	if len(all) == 0 {
		t.Fatal("no message was acknowledged")
	}
}

// durableSendReq is a SEND_MESSAGE request as the Go client writes it.
func durableSendReq(topic string, queue int32, body []byte, id string) *protocol.Command {
	req := protocol.NewRequest(protocol.ReqSendMessage)
	h := protocol.SendMessageRequestHeader{
		ProducerGroup: "durability", Topic: topic, DefaultTopic: "TBW102", DefaultTopicQueueNums: 4,
		QueueID: queue, BornTimestamp: time.Now().UnixMilli(),
		Properties:     string(protocol.AppendProperty(nil, idProp, id)),
		ReconsumeTimes: protocol.Some[int32](0), UnitMode: protocol.Some(false),
		Batch: protocol.Some(false), MaxReconsumeTimes: protocol.Some[int32](0), BrokerName: broker0,
	}
	h.Encode(req)
	req.Body = body
	return req
}

// verifyAcked reads every queue of topic and checks each acknowledged
// message at its offset.
func verifyAcked(tb testing.TB, conn *remoting.Conn, topic string, queues int32, all map[queueOffset]acked, cycle int) {
	tb.Helper()
	if len(all) == 0 {
		return
	}
	stored := map[queueOffset]acked{}
	for q := range queues {
		var prev int64 = -1
		for _, m := range pullAll(tb, conn, "verify", topic, q, 0) {
			if m.QueueOffset != prev+1 {
				tb.Fatalf("after restart %d: queue %d offsets jump from %d to %d", cycle, q, prev, m.QueueOffset)
			}
			prev = m.QueueOffset
			id, _ := m.Property(idProp)
			if !bytes.HasPrefix(m.Body, []byte(id)) {
				tb.Fatalf("after restart %d: queue %d offset %d: body does not start with its id %q", cycle, q, m.QueueOffset, id)
			}
			stored[queueOffset{q, m.QueueOffset}] = acked{payloadHash(m.Body), id}
		}
	}
	missing := 0
	for qo, a := range all {
		got, ok := stored[qo]
		switch {
		case !ok:
			missing++
			if missing <= 5 {
				tb.Errorf("after restart %d: acknowledged %s at queue %d offset %d is missing", cycle, a.id, qo.queue, qo.offset)
			}
		case got != a:
			tb.Errorf("after restart %d: queue %d offset %d holds %s, acknowledged for %s (or its payload changed)",
				cycle, qo.queue, qo.offset, got.id, a.id)
		}
	}
	if missing > 0 || tb.Failed() {
		tb.Fatalf("after restart %d: %d of %d acknowledged messages missing", cycle, missing, len(all))
	}
}
