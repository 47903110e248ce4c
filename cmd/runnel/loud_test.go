package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// TestCLIUnknownSubcommandsFail: a misspelt subcommand of a command group
// exits 1 with a suggestion (it printed the group's help and exited 0);
// the group alone still prints its help and exits 0.
func TestCLIUnknownSubcommandsFail(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"topic", "creat", "x"}, `unknown command "creat" for "runnel topic"; did you mean create?`},
		{[]string{"checkpoint", "lst", t.TempDir()}, `unknown command "lst" for "runnel checkpoint"; did you mean list?`},
		{[]string{"group", "lagg", "g"}, `unknown command "lagg" for "runnel group"`},
		{[]string{"savepoint", "nope"}, `unknown command "nope" for "runnel savepoint"`},
	} {
		out, err := runnelCmd(ctx, c.args...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), c.want) {
			t.Errorf("runnel %s: %v, want exit 1 mentioning %q; output:\n%s", strings.Join(c.args, " "), err, c.want, out)
		}
	}
	out, err := runnelCmd(ctx, "topic").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Available Commands:") {
		t.Errorf("runnel topic: %v, want its help and exit 0:\n%s", err, out)
	}
}

// TestCLIDeadNameServerHint: every cluster command against a name server
// that is not there says what to check, as produce did.
func TestCLIDeadNameServerHint(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ns := "--namesrv=" + dead
	for _, args := range [][]string{
		{"topic", "list", ns},
		{"topic", "create", "x", ns},
		{"topic", "describe", "x", ns},
		{"group", "lag", "g", "--topic", "x", ns},
		{"produce", "x", "--body", "b", ns},
	} {
		out, err := runnelCmd(ctx, append(args, "--timeout", "2s")...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "is `runnel broker` running?") ||
			!strings.Contains(string(out), dead) {
			t.Errorf("runnel %s: %v; want exit 1 with the hint:\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestCLITopicShrinkRefused: updating a topic to fewer queues would hide
// the messages of the queues beyond; the command refuses, saying how many,
// unless --force, which then says what it did.
func TestCLITopicShrinkRefused(t *testing.T) {
	e := newCLIEnv(t)
	ns := "--namesrv=" + e.ns
	e.ok("", "topic", "create", "scratch", "--queues", "4", ns)
	e.ok("", "produce", "scratch", "--body", "1", "--body", "2", "--body", "3", "--body", "4", "--body", "5", "--body", "6", "--body", "7", ns)
	c, err := e.cl.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r, err := c.RefreshRoute(e.ctx, "scratch")
	if err != nil {
		t.Fatal(err)
	}
	var hidden int64
	for _, q := range r.SubscribeQueues() {
		if q.QueueID < 2 {
			continue
		}
		hi, err := c.MaxOffset(e.ctx, protocol.MessageQueue{Topic: "scratch", BrokerName: q.BrokerName, QueueID: q.QueueID})
		if err != nil {
			t.Fatal(err)
		}
		hidden += hi
	}
	if hidden == 0 {
		t.Fatal("round robin left queues 2 and 3 empty: the test proves nothing")
	}
	res := e.run("", "topic", "create", "scratch", "--queues", "2", ns)
	want := fmt.Sprintf("--queues 2 would make queues 2-3 unreadable to consumers, hiding %d messages they still hold; pass --force", hidden)
	if res.code != 1 || !strings.Contains(res.stderr, want) {
		t.Fatalf("shrink without --force: %v\nwant exit 1 and %q", res, want)
	}
	mustMatch(t, e.ok("", "topic", "describe", "scratch", ns), `(?m)^  broker-\S+/3 `) // unchanged

	res = e.run("", "topic", "create", "scratch", "--queues", "2", "--force", ns)
	if res.code != 0 || !strings.Contains(res.stderr, fmt.Sprintf("shrank topic scratch from 4 to 2 queues (--force): %d messages in queues 2-3 are no longer readable", hidden)) {
		t.Fatalf("shrink with --force: %v", res)
	}
	if regexp.MustCompile(`(?m)^  broker-\S+/3 `).MatchString(e.ok("", "topic", "describe", "scratch", ns)) {
		t.Error("queue 3 still readable after the forced shrink")
	}
	// Growing needs no --force.
	e.ok("", "topic", "create", "scratch", "--queues", "3", ns)
}
