package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/pipeline/wmhandler"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/sink/wmsink"
	"github.com/runnel-dev/runnel/source"
	"github.com/runnel-dev/runnel/source/wmsource"
)

// The watermill kill test re-executes this test binary as the job process
// (dispatched from init, before the package's TestMain).
const (
	envWMChild   = "RUNNEL_E2E_WM_CHILD"
	envWMDir     = "RUNNEL_E2E_WM_DIR"
	envWMIn      = "RUNNEL_E2E_WM_IN"
	envWMOut     = "RUNNEL_E2E_WM_OUT"
	envWMControl = "RUNNEL_E2E_WM_CONTROL"
	// EnvAMQPURL names the RabbitMQ the AMQP tests use (.ci/run sets it).
	envAMQPURL = "RUNNEL_TEST_AMQP_URL"

	wmMessages      = 150
	wmSubscriptions = 4
)

func init() {
	if os.Getenv(envWMChild) != "" {
		os.Exit(wmChild())
	}
}

func amqpURL(t *testing.T) string {
	t.Helper()
	u := os.Getenv(envAMQPURL)
	if u == "" {
		t.Skip(envAMQPURL + " is unset: skipping the RabbitMQ (watermill-amqp) tests; .ci/run starts RabbitMQ and sets it, e.g. amqp://guest:guest@127.0.0.1:5672/")
	}
	return u
}

// amqpConfig is a durable queue per topic, published with confirms.
func amqpConfig(url string) wmamqp.Config {
	cfg := wmamqp.NewDurableQueueConfig(url)
	cfg.Publish.ConfirmDelivery = true
	return cfg
}

// ackingSubscriber is the control's broken adapter: it acks every message as
// soon as it arrives and passes a copy on, so a kill loses what was in
// flight.
type ackingSubscriber struct{ message.Subscriber }

func (a ackingSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := a.Subscriber.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	go func() { // ends when the subscriber closes in (after ctx ends)
		defer close(out)
		for m := range in {
			c := m.Copy()
			m.Ack()
			select {
			case out <- c:
			case <-ctx.Done():
			}
		}
	}()
	return out, nil
}

// wmChild runs the AMQP job until SIGTERM (graceful stop, exit 0) or SIGKILL.
func wmChild() int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "watermill child:", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	dir, url := os.Getenv(envWMDir), os.Getenv(envAMQPURL)
	sub, err := wmamqp.NewSubscriber(amqpConfig(url), watermill.NopLogger{})
	if err != nil {
		return fail(err)
	}
	defer sub.Close()
	pub, err := wmamqp.NewPublisher(amqpConfig(url), watermill.NopLogger{})
	if err != nil {
		return fail(err)
	}
	defer pub.Close()
	var in message.Subscriber = sub
	if os.Getenv(envWMControl) != "" {
		in = ackingSubscriber{sub}
	}
	kv, err := sink.NewKV(filepath.Join(dir, "kv"), func(m *message.Message) []byte { return []byte(m.UUID) },
		func(dst []byte, m *message.Message) ([]byte, error) { return append(dst, m.Payload...), nil })
	if err != nil {
		return fail(err)
	}
	job := pipeline.New("wm-amqp", pipeline.CheckpointDir(filepath.Join(dir, "job")), pipeline.CheckpointInterval(20*time.Millisecond))
	msgs := pipeline.FromSource(job, "in", wmsource.New(in, os.Getenv(envWMIn), wmsource.WithSubscriptions(wmSubscriptions)))
	h := func(m *message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage(m.UUID, append([]byte("done:"), m.Payload...))}, nil
	}
	// About 200 messages/s whatever the mode, so that kills land mid-run.
	throttle := middleware.NewThrottle(1, 5*time.Millisecond)
	done := wmhandler.Handle(msgs, "enrich", wmhandler.Wrap(h, middleware.CorrelationID, middleware.Recoverer, throttle.Middleware))
	pipeline.To(done, "kv", kv)
	pipeline.To(done, "out", wmsink.New(pub, os.Getenv(envWMOut)))
	fmt.Println("ready") // SIGTERM is handled from here on
	if err := job.Run(ctx); err != nil {
		return fail(err)
	}
	return 0
}

// outputCollector counts the UUIDs published to the output queue.
type outputCollector struct {
	mu   sync.Mutex
	seen map[string]int
}

func (c *outputCollector) run(ch <-chan *message.Message) {
	for m := range ch {
		c.mu.Lock()
		c.seen[m.UUID]++
		c.mu.Unlock()
		m.Ack()
	}
}

func (c *outputCollector) counts() (distinct, total int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.seen {
		distinct++
		total += n
	}
	return distinct, total
}

// readyMessages returns the number of messages ready in a queue.
func readyMessages(t *testing.T, url, queue string) int {
	t.Helper()
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return q.Messages
}

func deleteQueues(url string, queues ...string) {
	conn, err := amqp091.Dial(url)
	if err != nil {
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	defer ch.Close()
	for _, q := range queues {
		_, _ = ch.QueueDelete(q, false, false, false)
	}
}

type wmResult struct {
	kv             map[string]string
	distinct, outs int
	kills          int
	midRun         int // kills that landed with some but not all output published
}

// runWatermillKills publishes wmMessages to a fresh queue, runs the child
// job with kills SIGKILLs at random points, then a final run stopped
// gracefully once the input queue is drained (and, unless control, every
// message reached the output), and returns what the job wrote.
func runWatermillKills(t *testing.T, url string, seed uint64, kills int, control bool) wmResult {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 2))
	suffix := fmt.Sprintf("%d-%d", os.Getpid(), rng.Uint32())
	inQ, outQ := "runnel-e2e-wm-in-"+suffix, "runnel-e2e-wm-out-"+suffix
	t.Cleanup(func() { deleteQueues(url, inQ, outQ) })
	dir := t.TempDir()

	pub, err := wmamqp.NewPublisher(amqpConfig(url), watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	sub, err := wmamqp.NewSubscriber(amqpConfig(url), watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	for _, q := range []string{inQ, outQ} {
		if err := sub.SubscribeInitialize(q); err != nil {
			t.Fatal(err)
		}
	}
	for i := range wmMessages {
		m := message.NewMessage(fmt.Sprintf("m%04d", i), fmt.Appendf(nil, "p%04d", i))
		if err := pub.Publish(inQ, m); err != nil {
			t.Fatal(err)
		}
	}
	collector := &outputCollector{seen: map[string]int{}}
	subCtx, cancelSub := context.WithCancel(context.Background())
	outCh, err := sub.Subscribe(subCtx, outQ)
	if err != nil {
		t.Fatal(err)
	}
	var cwg sync.WaitGroup
	cwg.Go(func() { collector.run(outCh) })
	defer func() { cancelSub(); cwg.Wait() }()

	start := func() (*exec.Cmd, <-chan error) {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), envWMChild+"=1", envWMDir+"="+dir, envWMIn+"="+inQ, envWMOut+"="+outQ, envAMQPURL+"="+url)
		if control {
			cmd.Env = append(cmd.Env, envWMControl+"=1")
		}
		cmd.Stderr = os.Stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		ready := make(chan bool, 1)
		go func() {
			line, _ := bufio.NewReader(stdout).ReadString('\n')
			ready <- line == "ready\n"
			_, _ = io.Copy(io.Discard, stdout)
		}()
		select {
		case ok := <-ready:
			if !ok {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				t.Fatal("child did not start")
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatal("child not ready within 30s")
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		return cmd, done
	}
	res := wmResult{}
	for i := 0; i < kills; i++ {
		cmd, done := start()
		delay := time.Duration(150+rng.IntN(350)) * time.Millisecond
		select {
		case err := <-done:
			t.Fatalf("child run %d ended by itself: %v", i, err)
		case <-time.After(delay):
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-done
			res.kills++
			if d, _ := collector.counts(); d > 0 && d < wmMessages {
				res.midRun++
			}
		}
	}
	cmd, done := start()
	deadline := time.Now().Add(90 * time.Second)
	for {
		distinct, _ := collector.counts()
		if (control || distinct == wmMessages) && readyMessages(t, url, inQ) == 0 {
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-done
			t.Fatalf("final run: %d of %d messages reached the output, %d still queued", distinct, wmMessages, readyMessages(t, url, inQ))
		}
		select {
		case err := <-done:
			t.Fatalf("final child run ended by itself: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := <-done; err != nil {
		t.Fatalf("final child run (stopped): %v", err)
	}
	kv, err := sink.NewKV(filepath.Join(dir, "kv"), func(*message.Message) []byte { return nil },
		func(dst []byte, _ *message.Message) ([]byte, error) { return dst, nil })
	if err != nil {
		t.Fatal(err)
	}
	defer kv.Close()
	res.kv = map[string]string{}
	for k, v := range kv.All() {
		if k == nil {
			t.Fatal(string(v))
		}
		res.kv[string(k)] = string(v)
	}
	// Outputs published by the last run may still be on their way.
	for end := time.Now().Add(5 * time.Second); ; {
		res.distinct, res.outs = collector.counts()
		if control || res.distinct == wmMessages || time.Now().After(end) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	return res
}

// TestWatermillAMQPKill: a job reading a RabbitMQ queue through wmsource and
// publishing through wmsink, killed with SIGKILL several times, delivers every
// message at least once to the output queue and exactly once into the
// idempotent KV sink keyed by message UUID.
func TestWatermillAMQPKill(t *testing.T) {
	url := amqpURL(t)
	kills := 3
	if testing.Short() {
		kills = 2
	}
	res := runWatermillKills(t, url, uint64(time.Now().UnixNano()), kills, false)
	if len(res.kv) != wmMessages {
		t.Errorf("KV holds %d records, want exactly %d", len(res.kv), wmMessages)
	}
	for i := range wmMessages {
		id := fmt.Sprintf("m%04d", i)
		if v := res.kv[id]; v != fmt.Sprintf("done:p%04d", i) {
			t.Fatalf("KV %s = %q", id, v)
		}
	}
	if res.distinct != wmMessages {
		t.Fatalf("%d of %d messages reached the output queue", res.distinct, wmMessages)
	}
	if res.midRun == 0 {
		t.Fatalf("none of the %d kills landed mid-run", res.kills)
	}
	t.Logf("%d kills (%d mid-run); output queue got %d messages for %d distinct (%d redelivered after kills)", res.kills, res.midRun, res.outs, res.distinct, res.outs-res.distinct)
}

// TestWatermillAMQPKillControl: the same schedule with a broken adapter that
// acks on receipt must lose messages, proving the test can see losses.
func TestWatermillAMQPKillControl(t *testing.T) {
	url := amqpURL(t)
	if testing.Short() {
		t.Skip("control run skipped in -short")
	}
	lost := 0
	for attempt := range 3 {
		res := runWatermillKills(t, url, uint64(attempt)+77, 3, true)
		lost = wmMessages - len(res.kv)
		t.Logf("control attempt %d: KV holds %d of %d records", attempt, len(res.kv), wmMessages)
		if lost > 0 {
			return
		}
	}
	t.Fatal("the ack-on-receipt control lost nothing across kills: the kill test cannot detect losses")
}

// TestWatermillAMQPCloseRedelivers: messages a split held when it closed
// (job failure) are not acked: RabbitMQ delivers them again to the next
// reader.
func TestWatermillAMQPCloseRedelivers(t *testing.T) {
	url := amqpURL(t)
	q := fmt.Sprintf("runnel-e2e-wm-close-%d-%d", os.Getpid(), time.Now().UnixNano())
	t.Cleanup(func() { deleteQueues(url, q) })
	pub, err := wmamqp.NewPublisher(amqpConfig(url), watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	sub, err := wmamqp.NewSubscriber(amqpConfig(url), watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if err := sub.SubscribeInitialize(q); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(q, message.NewMessage("held", []byte("x"))); err != nil {
		t.Fatal(err)
	}
	src := wmsource.New(sub, q)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	first := func() *message.Message {
		r, err := src.Open(ctx, source.Split{ID: "0"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
		}()
		recs, err := r.Poll(ctx, 1)
		if err != nil || len(recs) != 1 {
			t.Fatalf("poll: %d records, %v", len(recs), err)
		}
		_ = r.Offset() // snapshotted, but the checkpoint never completes
		return recs[0].Value
	}
	if m := first(); m.UUID != "held" || wmamqp.IsMessageRedelivered(m) {
		t.Fatalf("first delivery %s (redelivered %v)", m.UUID, wmamqp.IsMessageRedelivered(m))
	}
	if m := first(); m.UUID != "held" || !wmamqp.IsMessageRedelivered(m) {
		t.Fatalf("second delivery %s (redelivered %v)", m.UUID, wmamqp.IsMessageRedelivered(m))
	}
	// The requeue reaches the broker asynchronously.
	for end := time.Now().Add(10 * time.Second); readyMessages(t, url, q) != 1; {
		if time.Now().After(end) {
			t.Fatalf("%d messages ready after two closes without completed checkpoints, want 1", readyMessages(t, url, q))
		}
		time.Sleep(10 * time.Millisecond) // polling the broker, with a deadline
	}
}
