package main

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// TestMain lets the tests re-execute this test binary as the real runnel
// command: with RUNNEL_TEST_MAIN=1 the process runs main() with the
// arguments after "--".
func TestMain(m *testing.M) {
	if os.Getenv("RUNNEL_TEST_MAIN") == "1" {
		for i, a := range os.Args {
			if a == "--" {
				os.Args = append([]string{"runnel"}, os.Args[i+1:]...)
				break
			}
		}
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func runnelCmd(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], append([]string{"-test.run=^$", "--"}, args...)...)
	cmd.Env = append(os.Environ(), "RUNNEL_TEST_MAIN=1")
	return cmd
}

// TestBrokerCommand starts `runnel broker` as a real process on free ports,
// waits for its readiness line, asks its name server for the TBW102 route
// over TCP, then stops it with SIGTERM and expects a clean exit.
func TestBrokerCommand(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := runnelCmd(ctx, "broker", "--listen", "127.0.0.1:0", "--namesrv-listen", "127.0.0.1:0",
		"--data", t.TempDir(), "--log-level", "warn")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()

	lines := bufio.NewScanner(stdout)
	var ready string
	for lines.Scan() {
		if strings.HasPrefix(lines.Text(), "runnel: ready") {
			ready = lines.Text()
			break
		}
	}
	if ready == "" {
		t.Fatalf("no readiness line; stderr:\n%s", stderr.String())
	}
	fields := map[string]string{}
	for _, f := range strings.Fields(ready)[2:] {
		k, v, _ := strings.Cut(f, "=")
		fields[k] = v
	}
	if fields["namesrv"] == "" || fields["broker"] == "" || fields["flush"] != "sync" {
		t.Fatalf("readiness line %q lacks namesrv/broker/flush", ready)
	}

	conn, err := remoting.Dial(ctx, fields["namesrv"])
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var route *protocol.Command
	deadline := time.Now().Add(10 * time.Second)
	for {
		req := protocol.NewRequest(protocol.ReqGetRouteInfoByTopic)
		(&protocol.GetRouteInfoRequestHeader{Topic: "TBW102"}).Encode(req)
		route, err = conn.Invoke(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if route.Code == protocol.ResSuccess || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond) // the broker registers asynchronously
	}
	if route.Code != protocol.ResSuccess {
		t.Fatalf("TBW102 route: code %d %q", route.Code, route.Remark)
	}
	var rd protocol.TopicRouteData
	if err := rd.Decode(route.Body); err != nil {
		t.Fatal(err)
	}
	if len(rd.BrokerDatas) != 1 || rd.BrokerDatas[0].BrokerAddrs[0] != fields["broker"] {
		t.Fatalf("route %+v does not name broker %s", rd, fields["broker"])
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for lines.Scan() {
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("runnel broker did not exit cleanly after SIGTERM: %v\nstderr:\n%s", err, stderr.String())
	}
}

// TestBrokerCommandBadFlags checks that bad flags fail fast with a clear
// message and a non-zero exit code.
func TestBrokerCommandBadFlags(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"broker", "--flush", "sometimes"}, `--flush "sometimes"`},
		{[]string{"broker", "--log-level", "loud"}, `--log-level "loud"`},
		{[]string{"broker", "--no-broker", "--no-namesrv"}, "leave nothing to run"},
		{[]string{"broker", "--no-namesrv"}, "needs --namesrv"},
		{[]string{"broker", "--listen", "not-an-address", "--namesrv-listen", "127.0.0.1:0", "--data", "DATA"}, "broker"},
		{[]string{"broker", "extra-arg"}, "unknown command"},
		{[]string{"nosuchcommand"}, "unknown command"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			args := append([]string(nil), tc.args...)
			for i, a := range args {
				if a == "DATA" {
					args[i] = t.TempDir()
				}
			}
			out, err := runnelCmd(ctx, args...).CombinedOutput()
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
