package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startedBroker is a `runnel broker` child process and its readiness line.
type startedBroker struct {
	cmd    *exec.Cmd
	fields map[string]string
	stderr *strings.Builder
	done   chan struct{}
}

// startBrokerCmd starts `runnel broker args...` and waits for its
// readiness line; it is killed at the end of the test.
func startBrokerCmd(t *testing.T, ctx context.Context, args ...string) *startedBroker {
	t.Helper()
	cmd := runnelCmd(ctx, append([]string{"broker"}, args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	b := &startedBroker{cmd: cmd, stderr: &strings.Builder{}, done: make(chan struct{})}
	cmd.Stderr = b.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan string, 1)
	go func() {
		defer close(b.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "runnel: ready") {
				ready <- sc.Text()
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-b.done
		_ = cmd.Wait()
	})
	select {
	case line := <-ready:
		b.fields = map[string]string{}
		for _, f := range strings.Fields(line)[2:] {
			k, v, _ := strings.Cut(f, "=")
			b.fields[k] = v
		}
	case <-b.done:
		t.Fatalf("runnel broker %v exited before it was ready", args)
	case <-time.After(30 * time.Second):
		t.Fatalf("runnel broker %v not ready after 30 s", args)
	}
	return b
}

// TestBrokerCommandHA runs a sync-master and its slave as two `runnel
// broker` processes: the readiness lines name the roles and the HA port,
// a message produced through the name server is on both, and `runnel
// broker status` shows the pair in sync.
func TestBrokerCommandHA(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	m := startBrokerCmd(t, ctx, "--listen", "127.0.0.1:0", "--namesrv-listen", "127.0.0.1:0", "--data", t.TempDir(),
		"--log-level", "warn", "--role", "sync-master")
	ns := m.fields["namesrv"]
	if m.fields["role"] != "SYNC_MASTER" || m.fields["ha"] == "" {
		t.Fatalf("master's readiness line %v: want role=SYNC_MASTER and its ha address", m.fields)
	}
	s := startBrokerCmd(t, ctx, "--listen", "127.0.0.1:0", "--no-namesrv", "--namesrv", ns, "--data", t.TempDir(),
		"--log-level", "warn", "--role", "slave", "--broker-id", "1")
	if s.fields["role"] != "SLAVE" || s.fields["id"] != "1" {
		t.Fatalf("slave's readiness line %v", s.fields)
	}
	run := func(stdin string, args ...string) string {
		t.Helper()
		cmd := runnelCmd(ctx, args...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("runnel %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	run("", "topic", "create", "ha", "--queues", "1", "--namesrv", ns)
	out := run("one\ntwo\n", "produce", "ha", "--namesrv", ns)
	if !strings.Contains(out, "produced 2 messages") {
		t.Fatalf("produce: %s", out)
	}
	// The sync-master answered SEND_OK: the slave's log end is the master's.
	status := run("", "broker", "status", "--namesrv", ns)
	master := regexp.MustCompile(`(?m)^broker-a\s+0\s+` + regexp.QuoteMeta(m.fields["broker"]) + `\s+master\s+(\d+)\s+slave ` +
		regexp.QuoteMeta(s.fields["broker"]) + ` acked (\d+) \(lag 0 B, in sync, sending \d+(\.\d)? [KMG]?i?B/s\)$`).FindStringSubmatch(status)
	slave := regexp.MustCompile(`(?m)^broker-a\s+1\s+` + regexp.QuoteMeta(s.fields["broker"]) + `\s+slave\s+(\d+)\s+from ` +
		regexp.QuoteMeta(m.fields["ha"]) + `, master at (\d+) \(lag 0 B, receiving \d+(\.\d)? [KMG]?i?B/s\)$`).FindStringSubmatch(status)
	if master == nil || slave == nil || master[1] == "0" || master[1] != master[2] || master[1] != slave[1] {
		t.Fatalf("runnel broker status:\n%s", status)
	}
}

// TestBrokerCommandHABadFlags: contradictory replication flags fail fast.
func TestBrokerCommandHABadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"broker", "--role", "leader"}, `--role "leader"`},
		{[]string{"broker", "--role", "slave", "--namesrv", "127.0.0.1:1"}, "needs --broker-id above 0"},
		{[]string{"broker", "--role", "slave", "--broker-id", "1"}, "a slave needs its master's name servers"},
		{[]string{"broker", "--broker-id", "2"}, "add --role slave"},
		{[]string{"broker", "--role", "sync-master", "--broker-id", "1"}, "a master's id is 0"},
		{[]string{"broker", "--role", "slave", "--broker-id", "1", "--master-ha", "127.0.0.1:1", "--ha-listen", "127.0.0.1:0"}, "--ha-listen is for a master"},
		{[]string{"broker", "--role", "sync-master", "--slave-timeout", "0s"}, "--slave-timeout"},
		{[]string{"broker", "status", "--broker", "127.0.0.1:1", "--timeout", "1s"}, "no broker answered"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			out, err := runnelCmd(ctx, tc.args...).CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Fatalf("exit: %v, want status 1; output:\n%s", err, out)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Fatalf("output does not mention %q:\n%s", tc.want, out)
			}
		})
	}
}
