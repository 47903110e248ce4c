package interop

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
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

	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/namesrv"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// envHAKills overrides the number of master kills of TestHAKill9.
const envHAKills = "RUNNEL_HA_KILLS"

// haProc is a `runnel broker` child process of a master/slave pair.
type haProc struct {
	bin    string
	args   []string
	cmd    *exec.Cmd
	fields map[string]string // of the readiness line
	stderr *lockedBuffer
	done   chan struct{}
	err    error
}

// startHAProc starts `runnel broker args...` and waits for its readiness
// line; the process is killed at the end of the test.
func startHAProc(tb testing.TB, bin string, args ...string) *haProc {
	tb.Helper()
	p := &haProc{bin: bin, args: args, stderr: &lockedBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, append([]string{"broker"}, args...)...)
	p.cmd.Stderr = p.stderr
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		tb.Fatalf("start %s: %v", bin, err)
	}
	ready := make(chan string, 1)
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
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	tb.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	select {
	case line := <-ready:
		p.fields = map[string]string{}
		for _, f := range strings.Fields(line)[2:] {
			k, v, _ := strings.Cut(f, "=")
			p.fields[k] = v
		}
	case <-p.done:
		tb.Fatalf("runnel broker %v exited before it was ready: %v\n%s", args, p.err, p.stderr)
	case <-time.After(30 * time.Second):
		tb.Fatalf("runnel broker %v not ready after 30 s\n%s", args, p.stderr)
	}
	return p
}

// kill9 SIGKILLs the process and waits until it is reaped.
func (p *haProc) kill9(tb testing.TB) {
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

// restart starts the same command again (same ports, same data).
func (p *haProc) restart(tb testing.TB) *haProc {
	tb.Helper()
	return startHAProc(tb, p.bin, p.args...)
}

// freeAddr returns a loopback address with a port free now.
func freeAddr(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// haStatus asks a broker for its replication status.
func haStatus(tb testing.TB, conn *remoting.Conn) protocol.HARuntimeInfo {
	tb.Helper()
	resp := invokeTB(tb, conn, protocol.NewRequest(protocol.ReqGetBrokerHAStatus), "GET_BROKER_HA_STATUS")
	var info protocol.HARuntimeInfo
	if resp.Code != protocol.ResSuccess || info.Decode(resp.Body) != nil {
		tb.Fatalf("HA status: code %d %s", resp.Code, resp.Body)
	}
	return info
}

// haCluster is a name server (in this process) and a master and a slave
// (`runnel broker` processes, sync flush) of one broker name; the master
// keeps its ports across restarts.
type haCluster struct {
	ns            string
	master, slave *haProc
}

func startHACluster(t *testing.T, bin, dir, role string) *haCluster {
	t.Helper()
	ns, err := namesrv.New(namesrv.WithListenAddr("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ns.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Close() })
	hc := &haCluster{ns: ns.Addr()}
	haAddr := freeAddr(t)
	hc.master = startHAProc(t, bin, "--listen", freeAddr(t), "--no-namesrv", "--namesrv", hc.ns,
		"--data", filepath.Join(dir, "master"), "--flush", "sync", "--log-level", "warn",
		"--role", role, "--ha-listen", haAddr)
	hc.slave = startHAProc(t, bin, "--listen", "127.0.0.1:0", "--no-namesrv", "--namesrv", hc.ns,
		"--data", filepath.Join(dir, "slave"), "--flush", "sync", "--log-level", "warn",
		"--role", "slave", "--broker-id", "1", "--master-ha", haAddr)
	return hc
}

// waitInSync waits until the master counts its slave in sync.
func (hc *haCluster) waitInSync(t *testing.T) {
	t.Helper()
	c := dialTB(t, hc.master.fields["broker"])
	waitUntil(t, 20*time.Second, "the slave connected to the master", func() bool {
		info := haStatus(t, c)
		return len(info.HAConnectionInfo) == 1 && info.HAConnectionInfo[0].InSync
	})
}

// haAck is a message the pair acknowledged (its queue and offset, its id).
type haAck struct {
	qo   queueOffset
	id   string
	phys int64
	size int
}

// startLoad starts an official producer (a new client instance, which
// reads the route afresh) sending from workers goroutines until stop; the
// channel returned gets what got SEND_OK.
func startLoad(t *testing.T, ns, topic, tag string, workers int, stop <-chan struct{}) <-chan []haAck {
	t.Helper()
	p := newProducer(t, &brokerEnv{nsAddr: ns}, producer.WithRetry(0), producer.WithSendMsgTimeout(3*time.Second))
	got := make(chan []haAck, 1)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-stop
		cancel() // the sends in flight to a killed master end now, unacknowledged
	}()
	go func() {
		defer func() { _ = p.Shutdown() }()
		got <- loadOfficial(ctx, t, p, topic, tag, workers)
	}()
	return got
}

// loadOfficial sends with p from workers goroutines until stop, and
// returns what got SEND_OK.
func loadOfficial(ctx context.Context, t *testing.T, p interface {
	SendSync(context.Context, ...*primitive.Message) (*primitive.SendResult, error)
}, topic, tag string, workers int) []haAck {
	var mu sync.Mutex
	var acks []haAck
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ctx.Err() == nil; n++ {
				id := fmt.Sprintf("%s-w%d-%d", tag, w, n)
				body := []byte(id + strings.Repeat("x", 64+rand.IntN(256)))
				msg := primitive.NewMessage(topic, body)
				msg.WithProperty(idProp, id)
				sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
				res, err := p.SendSync(sctx, msg)
				cancel()
				if err != nil {
					continue // killed, or not routable yet: unknown or refused
				}
				if res.Status != primitive.SendOK {
					continue // stored, but not confirmed on the slave
				}
				_, phys, perr := protocol.ParseOffsetMsgID(res.OffsetMsgID)
				if perr != nil {
					t.Errorf("send %s: offset msg id %q: %v", id, res.OffsetMsgID, perr)
					return
				}
				mu.Lock()
				acks = append(acks, haAck{qo: queueOffset{int32(res.MessageQueue.QueueId), res.QueueOffset}, id: id, phys: phys})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return acks
}

// readAt returns the id of the message at queue offset qo on the broker of
// conn ("" when there is none), pulling a window and caching it in seen.
func readAt(t *testing.T, conn *remoting.Conn, topic string, qo queueOffset, seen map[queueOffset]string) string {
	t.Helper()
	if id, ok := seen[qo]; ok {
		return id
	}
	for _, m := range pullAll(t, conn, "ha_verify", topic, qo.queue, qo.offset) {
		id, _ := m.Property(idProp)
		seen[queueOffset{qo.queue, m.QueueOffset}] = id
	}
	return seen[qo]
}

// TestHAKill9 is the kill proof. SyncMaster: a SYNC_MASTER (sync flush) and its
// slave as `runnel broker` processes, load from the official Go producer,
// the master SIGKILLed at a random moment and restarted, 30 times (8 with
// -short; RUNNEL_HA_KILLS overrides). After every kill each message that
// got SEND_OK is on the slave at the queue offset its answer named; at the
// end on the master too; no queue offset is acknowledged twice. Meanwhile
// an official push consumer and runnel's client (pulling from explicit
// offsets, as runnel's source does) consume through every kill: the
// official one receives every acknowledged message, runnel's reads each
// queue's offsets in order without a gap or a repeat, from the slave while
// the master is down. AsyncMaster: see haKillAsync; SlaveKill: see
// haKillSlave.
func TestHAKill9(t *testing.T) {
	t.Parallel()
	bin := buildRunnel(t, t.TempDir())
	t.Run("SyncMaster", func(t *testing.T) { haKillSync(t, bin) })
	t.Run("AsyncMaster", func(t *testing.T) { haKillAsync(t, bin) })
	t.Run("SlaveKill", func(t *testing.T) { haKillSlave(t, bin) })
}

// haKillSlave: the slave of a SYNC_MASTER SIGKILLed under load from the
// official producer and restarted, 3 times: it catches up with what the
// master took meanwhile (the master's lag for it reaches 0), and every
// message that got SEND_OK is on it at its queue offset.
func haKillSlave(t *testing.T, bin string) {
	tmp := t.TempDir()
	hc := startHACluster(t, bin, tmp, "sync-master")
	const topic, queues = "HAKillSlave", 2
	rc, err := client.New(client.WithNameServers(hc.ns))
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := rc.CreateTopic(ctx, hc.master.fields["broker"], client.TopicConfig{TopicName: topic, ReadQueueNums: queues, WriteQueueNums: queues}); err != nil {
		t.Fatal(err)
	}
	(&brokerEnv{nsAddr: hc.ns}).waitRoute(t, topic, queues)
	hc.waitInSync(t)
	stop := make(chan struct{})
	got := startLoad(t, hc.ns, topic, "s", 4, stop)
	for range 3 {
		time.Sleep(time.Duration(300+rand.IntN(500)) * time.Millisecond) // a random kill point, not synchronisation
		hc.slave.kill9(t)
		time.Sleep(time.Duration(100+rand.IntN(400)) * time.Millisecond) // load on the master alone
		hc.slave = hc.slave.restart(t)
		hc.waitInSync(t)
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	acks := <-got
	mc := dialTB(t, hc.master.fields["broker"])
	waitUntil(t, 30*time.Second, "the restarted slave caught up", func() bool {
		info := haStatus(t, mc)
		return len(info.HAConnectionInfo) == 1 && info.HAConnectionInfo[0].Diff == 0
	})
	sc := dialTB(t, hc.slave.fields["broker"])
	seen := map[queueOffset]string{}
	for _, a := range acks {
		if got := readAt(t, sc, topic, a.qo, seen); got != a.id {
			t.Fatalf("acknowledged %s at queue %d offset %d; the restarted slave holds %q there", a.id, a.qo.queue, a.qo.offset, got)
		}
	}
	if len(acks) == 0 {
		t.Fatal("no message got SEND_OK")
	}
	t.Logf("3 slave kills under load: %d acknowledged, all on the slave once it caught up", len(acks))
}

func haKillSync(t *testing.T, bin string) {
	kills := 30
	if testing.Short() {
		kills = 8
	}
	if v := os.Getenv(envHAKills); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive count", envHAKills, v)
		}
		kills = n
	}
	tmp := t.TempDir()
	hc := startHACluster(t, bin, tmp, "sync-master")
	const topic, queues = "HAKill", 4
	rc, err := client.New(client.WithNameServers(hc.ns))
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := rc.CreateTopic(ctx, hc.master.fields["broker"], client.TopicConfig{TopicName: topic, ReadQueueNums: queues, WriteQueueNums: queues}); err != nil {
		t.Fatal(err)
	}
	(&brokerEnv{nsAddr: hc.ns}).waitRoute(t, topic, queues)
	hc.waitInSync(t)

	// Consumers running through every kill.
	official := newLedgerSet()
	push := newPushConsumer(t, &brokerEnv{nsAddr: hc.ns}, uniqueName("ha_cg"), uniqueInstance("ha_push"))
	if err := push.Subscribe(topic, consumer.MessageSelector{Type: consumer.TAG, Expression: "*"},
		func(_ context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
			for _, m := range msgs {
				official.add(m.GetProperty(idProp))
			}
			return consumer.ConsumeSuccess, nil
		}); err != nil {
		t.Fatal(err)
	}
	if err := push.Start(); err != nil {
		t.Fatal(err)
	}
	reader := startOffsetReader(t, rc, topic, queues)

	all := map[queueOffset]string{}
	var acked []haAck
	start := time.Now()
	for cycle := 0; cycle < kills; cycle++ {
		stop := make(chan struct{})
		got := startLoad(t, hc.ns, topic, fmt.Sprint("c", cycle), 4, stop)
		time.Sleep(time.Duration(200+rand.IntN(400)) * time.Millisecond) // a random kill point, not synchronisation
		hc.master.kill9(t)
		close(stop)
		cycleAcks := <-got
		for _, a := range cycleAcks {
			if prev, ok := all[a.qo]; ok && prev != a.id {
				t.Fatalf("queue %d offset %d acknowledged for %s after it was acknowledged for %s", a.qo.queue, a.qo.offset, a.id, prev)
			}
			all[a.qo] = a.id
		}
		acked = append(acked, cycleAcks...)
		// Every SEND_OK of the cycle is on the slave, with the master dead.
		sc := dialTB(t, hc.slave.fields["broker"])
		seen := map[queueOffset]string{}
		for _, a := range cycleAcks {
			if got := readAt(t, sc, topic, a.qo, seen); got != a.id {
				t.Fatalf("cycle %d: acknowledged %s at queue %d offset %d; the slave holds %q there", cycle, a.id, a.qo.queue, a.qo.offset, got)
			}
		}
		_ = sc.Close()
		hc.master = hc.master.restart(t)
		hc.waitInSync(t)
	}
	if len(acked) == 0 {
		t.Fatal("no message got SEND_OK")
	}
	// Everything acknowledged is on both, at the same offsets.
	for _, addr := range []string{hc.master.fields["broker"], hc.slave.fields["broker"]} {
		c := dialTB(t, addr)
		seen := map[queueOffset]string{}
		for qo, id := range all {
			if got := readAt(t, c, topic, qo, seen); got != id {
				t.Fatalf("%s: queue %d offset %d holds %q, acknowledged for %s", addr, qo.queue, qo.offset, got, id)
			}
		}
	}
	info := haStatus(t, dialTB(t, hc.slave.fields["broker"]))
	t.Logf("%d kills, %d acknowledged (SEND_OK) and found on the slave after each kill and on both at the end, in %v; slave at %d",
		kills, len(acked), time.Since(start).Round(time.Millisecond), info.HAClientRuntimeInfo.MaxOffset)

	// The consumers got everything.
	cw := time.Now()
	defer func() {
		t.Logf("the consumers had everything %v after the last kill", time.Since(cw).Round(time.Millisecond))
	}()
	waitUntil(t, 60*time.Second, "the official consumer received every acknowledged message", func() bool {
		for _, id := range all {
			if !official.has(id) {
				return false
			}
		}
		return true
	})
	reader.check(t, all)
}

// ledgerSet is a concurrent set of message ids.
type ledgerSet struct {
	mu sync.Mutex
	m  map[string]bool
}

func newLedgerSet() *ledgerSet { return &ledgerSet{m: map[string]bool{}} }

func (l *ledgerSet) add(id string) {
	l.mu.Lock()
	l.m[id] = true
	l.mu.Unlock()
}

func (l *ledgerSet) has(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.m[id]
}

// offsetReader reads every queue of a topic with runnel's client from
// offset 0, each from the offset after the last message it got (as
// runnel's source does), recording the id at every offset and any gap or
// repeat.
type offsetReader struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	slaves atomic.Int64 // pulls a slave answered
	mu     sync.Mutex
	got    map[queueOffset]string
	bad    []string
}

func startOffsetReader(t *testing.T, c *client.Client, topic string, queues int32) *offsetReader {
	t.Helper()
	r, err := c.Route(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	or := &offsetReader{cancel: cancel, got: map[queueOffset]string{}}
	for _, q := range r.SubscribeQueues() {
		or.wg.Add(1)
		go func() {
			defer or.wg.Done()
			next := int64(0)
			for ctx.Err() == nil {
				res, err := c.Pull(ctx, client.PullRequest{Queue: q, Offset: next, Group: "ha_reader", MaxMsgs: 32, Suspend: time.Second})
				if err != nil {
					pause(ctx, 50*time.Millisecond) // no broker of the queue reachable for now
					continue
				}
				if res.BrokerID != 0 {
					or.slaves.Add(1)
				}
				or.mu.Lock()
				for _, m := range res.Messages {
					if m.QueueOffset != next {
						or.bad = append(or.bad, fmt.Sprintf("queue %d: got offset %d, expected %d", q.QueueID, m.QueueOffset, next))
					}
					id, _ := m.Property(idProp)
					or.got[queueOffset{q.QueueID, m.QueueOffset}] = id
					next = m.QueueOffset + 1
				}
				or.mu.Unlock()
				if res.Status == client.PullOffsetIllegal {
					or.mu.Lock()
					or.bad = append(or.bad, fmt.Sprintf("queue %d: offset %d illegal (next begin %d)", q.QueueID, next, res.NextBeginOffset))
					or.mu.Unlock()
					pause(ctx, 100*time.Millisecond)
				}
			}
		}()
	}
	t.Cleanup(func() { or.stop() })
	return or
}

func pause(ctx context.Context, d time.Duration) {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
	case <-tm.C:
	}
}

func (or *offsetReader) stop() {
	or.cancel()
	or.wg.Wait()
}

// check waits until the reader has every acknowledged message and fails on
// a gap, a repeat or a message other than the acknowledged one.
func (or *offsetReader) check(t *testing.T, all map[queueOffset]string) {
	t.Helper()
	waitUntil(t, 60*time.Second, "runnel's reader got every acknowledged message", func() bool {
		or.mu.Lock()
		defer or.mu.Unlock()
		for qo := range all {
			if _, ok := or.got[qo]; !ok {
				return false
			}
		}
		return true
	})
	or.stop()
	or.mu.Lock()
	defer or.mu.Unlock()
	if len(or.bad) > 0 {
		t.Fatalf("runnel's reader skipped or repeated offsets: %s", strings.Join(or.bad[:min(len(or.bad), 10)], "; "))
	}
	for qo, id := range all {
		if or.got[qo] != id {
			t.Fatalf("runnel's reader got %q at queue %d offset %d, acknowledged for %s", or.got[qo], qo.queue, qo.offset, id)
		}
	}
	if or.slaves.Load() == 0 {
		t.Fatal("runnel's reader never read from the slave while the master was down")
	}
	t.Logf("runnel's reader: %d pulls answered by the slave", or.slaves.Load())
}

// haKillAsync: an ASYNC_MASTER answers without waiting for its slave, so
// a kill can lose what the slave had not acknowledged, and only that: every
// message the master acknowledged below the slave's acknowledged log end
// (as the master reported just before the kill) is on the slave; after the
// restart everything acknowledged is on the master and the slave has
// caught up with it.
func haKillAsync(t *testing.T, bin string) {
	kills := 5
	tmp := t.TempDir()
	hc := startHACluster(t, bin, tmp, "async-master")
	const topic, queues = "HAKillAsync", 2
	rc, err := client.New(client.WithNameServers(hc.ns))
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := rc.CreateTopic(ctx, hc.master.fields["broker"], client.TopicConfig{TopicName: topic, ReadQueueNums: queues, WriteQueueNums: queues}); err != nil {
		t.Fatal(err)
	}
	(&brokerEnv{nsAddr: hc.ns}).waitRoute(t, topic, queues)
	all := map[queueOffset]haAck{}
	var lost, maxLag int64
	for cycle := 0; cycle < kills; cycle++ {
		hc.waitInSync(t)
		mc := dialTB(t, hc.master.fields["broker"])
		stop := make(chan struct{})
		got := startLoad(t, hc.ns, topic, fmt.Sprint("a", cycle), 4, stop)
		time.Sleep(time.Duration(300+rand.IntN(400)) * time.Millisecond) // a random kill point, not synchronisation
		info := haStatus(t, mc)
		if len(info.HAConnectionInfo) != 1 {
			t.Fatalf("cycle %d: the master reports %d slaves", cycle, len(info.HAConnectionInfo))
		}
		slaveAck := info.HAConnectionInfo[0].SlaveAckOffset
		maxLag = max(maxLag, info.HAConnectionInfo[0].Diff)
		hc.master.kill9(t)
		close(stop)
		cycleAcks := <-got
		sc := dialTB(t, hc.slave.fields["broker"])
		seen := map[queueOffset]string{}
		for _, a := range cycleAcks {
			if prev, ok := all[a.qo]; ok && prev.id != a.id {
				t.Fatalf("queue %d offset %d acknowledged for %s after %s", a.qo.queue, a.qo.offset, a.id, prev.id)
			}
			all[a.qo] = a
			if readAt(t, sc, topic, a.qo, seen) == a.id {
				continue
			}
			if a.phys < slaveAck {
				t.Fatalf("cycle %d: %s at physical offset %d, below the slave's acknowledged %d reported before the kill, is not on the slave", cycle, a.id, a.phys, slaveAck)
			}
			lost++
		}
		_ = sc.Close()
		hc.master = hc.master.restart(t)
	}
	hc.waitInSync(t)
	mc, sc := dialTB(t, hc.master.fields["broker"]), dialTB(t, hc.slave.fields["broker"])
	waitUntil(t, 20*time.Second, "the slave caught up", func() bool {
		info := haStatus(t, mc)
		return len(info.HAConnectionInfo) == 1 && info.HAConnectionInfo[0].Diff == 0
	})
	ms, ss := map[queueOffset]string{}, map[queueOffset]string{}
	for qo, a := range all {
		if got := readAt(t, mc, topic, qo, ms); got != a.id {
			t.Fatalf("master: queue %d offset %d holds %q, acknowledged for %s", qo.queue, qo.offset, got, a.id)
		}
		if got := readAt(t, sc, topic, qo, ss); got != a.id {
			t.Fatalf("slave after catching up: queue %d offset %d holds %q, acknowledged for %s", qo.queue, qo.offset, got, a.id)
		}
	}
	t.Logf("%d kills of an ASYNC_MASTER: %d acknowledged, %d of them not on the slave at a kill (all past its reported ack); largest lag reported before a kill %d B",
		kills, len(all), lost, maxLag)
	if len(all) == 0 {
		t.Fatal("no message was acknowledged")
	}

}
