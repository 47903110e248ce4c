package watermill_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/client"
	rwm "github.com/runnel-dev/runnel/transport/watermill"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The suite's multiplier (10 Subscribers fanned into one channel)
		// forwards on goroutines that block for good when the test stops
		// reading with a duplicate still in hand; they are the suite's, not
		// ours (every goroutine of this package is still checked).
		goleak.IgnoreAnyFunction("github.com/ThreeDotsLabs/watermill/internal/subscriber.(*multiplier).Subscribe.func2"),
		goleak.IgnoreAnyFunction("github.com/ThreeDotsLabs/watermill/internal/subscriber.(*multiplier).Subscribe.func3"),
	)
}

// env is an in-process name server and broker on loopback.
type env struct {
	t        testing.TB
	nsAddr   string
	brokerOp []broker.Option
}

// newEnv starts a name server and a broker ("broker-a"), stopped at the end
// of the test.
func newEnv(t testing.TB, opts ...broker.Option) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ns := testutil.StartNameServer(ctx, t)
	b, err := broker.New(append([]broker.Option{broker.WithDataDir(t.TempDir()), broker.WithListenAddr("127.0.0.1:0"),
		broker.WithNameServers(ns.Addr()), broker.WithFlushMode(broker.FlushAsync)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = b.Shutdown(ctx)
	})
	return &env{t: t, nsAddr: ns.Addr()}
}

// clientOptions are the options of every Client the tests' Publishers and
// Subscribers create.
func clientOptions() []client.Option {
	return []client.Option{client.WithClientIP(netip.MustParseAddr("127.0.0.1"))}
}

// pubSubConfig describes the Publishers and Subscribers of a test.
type pubSubConfig struct {
	queues int    // queues of topics created (SubscribeInitialize and auto-created)
	group  string // fixed consumer group; "" = derived from the topic
	mutate func(*rwm.SubscriberConfig)
}

func newPublisher(t testing.TB, nsAddr string, pc pubSubConfig) *rwm.Publisher {
	t.Helper()
	var popts []client.ProducerOption
	if pc.queues > 0 {
		popts = append(popts, client.WithDefaultTopicQueueNums(pc.queues))
	}
	pub, err := rwm.NewPublisher(rwm.PublisherConfig{NameServers: []string{nsAddr}, ClientOptions: clientOptions(),
		ProducerOptions: popts}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// watermill's suite does not close every Publisher and Subscriber it
	// makes (TestPublishSubscribeInOrder closes its multiplier before
	// subscribing); Close is idempotent, so close them all here as well.
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

func newSubscriber(t testing.TB, nsAddr string, pc pubSubConfig) *rwm.Subscriber {
	t.Helper()
	cfg := rwm.SubscriberConfig{NameServers: []string{nsAddr}, ClientOptions: clientOptions(),
		ConsumerGroup: pc.group, TopicQueueNums: pc.queues,
		GroupOptions: []client.GroupOption{client.WithRebalanceInterval(2 * time.Second)}}
	if pc.mutate != nil {
		pc.mutate(&cfg)
	}
	sub, err := rwm.NewSubscriber(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// childBroker is a `runnel broker` child process (embedded name server and
// broker) on fixed loopback ports with a data directory kept across
// restarts (stop, start).
type childBroker struct {
	t       testing.TB
	bin     string
	dataDir string
	nsAddr  string
	bAddr   string
	mu      struct {
		sync.Mutex
		cmd *exec.Cmd
	}
}

// buildRunnel builds cmd/runnel into a temporary directory.
func buildRunnel(t testing.TB) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	bin := filepath.Join(t.TempDir(), "runnel")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/runnel")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/runnel: %v\n%s", err, out)
	}
	return bin
}

func freePort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func startChildBroker(t testing.TB) *childBroker {
	t.Helper()
	cb := &childBroker{t: t, bin: buildRunnel(t), dataDir: t.TempDir(), nsAddr: freePort(t), bAddr: freePort(t)}
	if err := cb.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cb.stop(); err != nil {
			t.Errorf("stop runnel broker: %v", err)
		}
	})
	return cb
}

func (cb *childBroker) start() error {
	cmd := exec.Command(cb.bin, "broker", "--listen", cb.bAddr, "--namesrv-listen", cb.nsAddr,
		"--data", cb.dataDir, "--flush", "async", "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	cb.mu.Lock()
	cb.mu.cmd = cmd
	cb.mu.Unlock()
	deadline := time.Now().Add(20 * time.Second)
	for _, addr := range []string{cb.nsAddr, cb.bAddr} {
		for {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err == nil {
				_ = c.Close()
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("runnel broker did not listen on %s: %w", addr, err)
			}
			time.Sleep(20 * time.Millisecond) // polling a child process's port
		}
	}
	return nil
}

// stop ends the child gracefully (SIGTERM), killing it after 20 s.
func (cb *childBroker) stop() error {
	cb.mu.Lock()
	cmd := cb.mu.cmd
	cb.mu.cmd = nil
	cb.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		return errors.New("runnel broker did not stop within 20 s; killed")
	}
}
