package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/runnel-dev/runnel/embedded"
	"github.com/runnel-dev/runnel/examples/wordcount/wordcount"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/transport/client"
)

// cliEnv is an embedded name server + broker in this process and helpers to
// run the runnel command (this test binary re-executed) against it.
type cliEnv struct {
	t   *testing.T
	ctx context.Context
	cl  *embedded.Cluster
	ns  string
}

func newCLIEnv(t *testing.T) *cliEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	cl, err := embedded.Start(ctx, embedded.WithDataDir(t.TempDir()))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cl.Close(); err != nil {
			t.Error(err)
		}
		cancel()
		goleak.VerifyNone(t)
	})
	return &cliEnv{t: t, ctx: ctx, cl: cl, ns: cl.NameServer()}
}

// result is one command's outcome.
type result struct {
	args           []string
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return fmt.Sprintf("runnel %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(r.args, " "), r.code, r.stdout, r.stderr)
}

// run runs `runnel args...` with stdin and waits for it.
func (e *cliEnv) run(stdin string, args ...string) result {
	e.t.Helper()
	cmd := runnelCmd(e.ctx, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{args: args, stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		e.t.Fatalf("runnel %v: %v", args, err)
	}
	return r
}

// ok runs a command that must succeed and returns its stdout.
func (e *cliEnv) ok(stdin string, args ...string) string {
	e.t.Helper()
	r := e.run(stdin, args...)
	if r.code != 0 {
		e.t.Fatalf("%v", r)
	}
	return r.stdout
}

// fails runs a command that must exit with status 1 and mention want.
func (e *cliEnv) fails(want string, args ...string) {
	e.t.Helper()
	r := e.run("", args...)
	if r.code != 1 || !strings.Contains(r.stdout+r.stderr, want) {
		e.t.Errorf("want exit 1 mentioning %q; got %v", want, r)
	}
}

func mustMatch(t *testing.T, out string, res ...string) {
	t.Helper()
	for _, re := range res {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("output lacks %s:\n%s", re, out)
		}
	}
}

// TestTopicProduceConsume walks a topic through create, list, describe,
// produce (stdin, --body, --file), consume (earliest, offset, JSON, tag
// filter, one queue) and delete, and checks the numbers each command shows.
func TestTopicProduceConsume(t *testing.T) {
	e := newCLIEnv(t)
	ns := "--namesrv=" + e.ns

	mustMatch(t, e.ok("", "topic", "create", "orders", "--queues", "4", ns), `(?m)^created topic orders \(4 queues, perm rw\) on DefaultCluster$`)
	list := e.ok("", "topic", "list", ns)
	mustMatch(t, list, `(?m)^orders$`)
	if strings.Contains(list, "TBW102") {
		t.Errorf("topic list shows system topics without --all:\n%s", list)
	}
	mustMatch(t, e.ok("", "topic", "list", "--all", ns), `(?m)^TBW102$`, `(?m)^orders$`)

	desc := e.ok("", "topic", "describe", "orders", ns)
	mustMatch(t, desc, `(?m)^  broker-\S+ +127\.0\.0\.1:\d+ \(master\) +4 +4 +rw$`, `(?m)^  broker-\S+/3 +0 +0 +0$`, `(?m)^  total +0$`)

	// 8 lines from stdin, with a tag, keys and properties on every message.
	var in strings.Builder
	for i := range 8 {
		fmt.Fprintf(&in, "line %d\n", i)
	}
	r := e.run(in.String(), "produce", "orders", "--tag", "created", "--keys", "k1,k2", "--property", "origin=test", "--property", "n=1", ns)
	if r.code != 0 {
		t.Fatalf("%v", r)
	}
	mustMatch(t, r.stdout, `(?m)^produced 8 messages to orders in \S+ \(\d+ msgs/s\)$`)
	if strings.Contains(r.stderr, "producing") {
		t.Errorf("progress bar drawn on stderr that is not a terminal:\n%s", r.stderr)
	}
	// Two --body messages with another tag, and a file.
	mustMatch(t, e.ok("", "produce", "orders", "--body", "b1", "--body", "b2", "--tag", "paid", ns), `produced 2 messages`)
	file := filepath.Join(t.TempDir(), "msgs.txt")
	if err := os.WriteFile(file, []byte("f1\nf2\nf3\nf4\nf5"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = e.run("", "produce", "orders", "--file", file, ns)
	if r.code != 0 {
		t.Fatalf("%v", r)
	}
	mustMatch(t, r.stdout, `produced 5 messages`)
	if r.stderr != "" {
		t.Errorf("stderr that is not a terminal got %q", r.stderr)
	}
	mustMatch(t, e.ok("", "produce", "orders", "--body", "one", "--tag", "single", ns), `(?m)^produced 1 message to orders in `)

	desc = e.ok("", "topic", "describe", "orders", ns)
	mustMatch(t, desc, `(?m)^  total +16$`)

	out := e.ok("", "consume", "orders", "--from", "earliest", "--count", "16", ns)
	if n := strings.Count(out, "\n"); n != 16 {
		t.Errorf("consume --count 16 printed %d lines:\n%s", n, out)
	}
	// Bodies as they are, not Go-quoted.
	mustMatch(t, out, `(?m)^broker-\S+/\d offset=\d+ tags=created keys=k1,k2 n=1 origin=test body=line 3$`,
		`(?m)^broker-\S+/\d offset=\d+ tags=paid body=b2$`, `(?m)^broker-\S+/\d offset=\d+ body=f5$`)
	// A tag filter, JSON output.
	out = e.ok("", "consume", "orders", "--from", "earliest", "--tag", "paid", "--json", "--idle", "1500ms", ns)
	if n := strings.Count(out, "\n"); n != 2 || !strings.Contains(out, `"tags":"paid"`) || !strings.Contains(out, `"body":"b1"`) {
		t.Errorf("consume --tag paid --json:\n%s", out)
	}
	// One queue from an offset: exactly what describe says it holds beyond.
	out = e.ok("", "consume", "orders", "--from", "1", "--queue", "0", "--idle", "1s", ns)
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l != "" && !regexp.MustCompile(`^broker-\S+/0 offset=[1-9]\d* `).MatchString(l) {
			t.Errorf("consume --queue 0 --from 1 printed %q", l)
		}
	}

	mustMatch(t, e.ok("", "topic", "delete", "orders", ns), `(?m)^deleted topic orders$`)
	e.fails(`unknown topic "orders"`, "topic", "describe", "orders", ns)
	if strings.Contains(e.ok("", "topic", "list", ns), "orders") {
		t.Error("deleted topic still listed")
	}
}

// TestConsumeTailsLatest starts `runnel consume --from latest` first, waits
// for its start line, then produces: only the new messages are printed and
// --count ends the command.
func TestConsumeTailsLatest(t *testing.T) {
	e := newCLIEnv(t)
	ns := "--namesrv=" + e.ns
	e.ok("", "topic", "create", "tail", "--queues", "2", ns)
	e.ok("", "produce", "tail", "--body", "old", ns)

	cmd := runnelCmd(e.ctx, "consume", "tail", "--count", "3", ns)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stderr)
	started := false
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "consuming tail from latest (2 queues)") {
			started = true
			break
		}
	}
	if !started {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatal("no start line from consume")
	}
	var rest strings.Builder
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = io.Copy(&rest, stderr) })
	e.ok("", "produce", "tail", "--body", "n1", "--body", "n2", "--body", "n3", ns)
	werr := cmd.Wait()
	wg.Wait()
	if werr != nil {
		t.Fatalf("consume: %v\n%s\n%s", werr, out.String(), rest.String())
	}
	got := out.String()
	if strings.Contains(got, "body=old") || strings.Count(got, "\n") != 3 {
		t.Fatalf("consume --from latest printed:\n%s", got)
	}
	for _, b := range []string{"n1", "n2", "n3"} {
		if !strings.Contains(got, "body="+b+"\n") {
			t.Errorf("missing %s in\n%s", b, got)
		}
	}
	mustMatch(t, rest.String(), `(?m)^consumed 3 messages$`)
}

// TestGroupOffsetsAndLag commits offsets for a group with the client, then
// checks `group offsets` and `group lag` per queue and in total, and the
// output for a group that committed nothing.
func TestGroupOffsetsAndLag(t *testing.T) {
	e := newCLIEnv(t)
	ns := "--namesrv=" + e.ns
	e.ok("", "topic", "create", "events", "--queues", "2", ns)
	var in strings.Builder
	for i := range 10 {
		fmt.Fprintf(&in, "e%d\n", i)
	}
	e.ok(in.String(), "produce", "events", ns)

	c, err := e.cl.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r, err := c.RefreshRoute(e.ctx, "events")
	if err != nil {
		t.Fatal(err)
	}
	qs := r.SubscribeQueues()
	maxes := make([]int64, len(qs))
	for i, q := range qs {
		if maxes[i], err = c.MaxOffset(e.ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if maxes[0]+maxes[1] != 10 {
		t.Fatalf("max offsets %v", maxes)
	}
	// Committed: queue 0 fully consumed but one, queue 1 at 1.
	if err := c.CommitOffset(e.ctx, "billing", qs[0], maxes[0]-1); err != nil {
		t.Fatal(err)
	}
	if err := c.CommitOffset(e.ctx, "billing", qs[1], 1); err != nil {
		t.Fatal(err)
	}
	wantLag := 1 + (maxes[1] - 1)

	out := e.ok("", "group", "offsets", "billing", "--topic", "events", ns)
	mustMatch(t, out,
		fmt.Sprintf(`(?m)^%s +%d +%d +1$`, regexp.QuoteMeta(queueName(qs[0])), maxes[0]-1, maxes[0]),
		fmt.Sprintf(`(?m)^%s +1 +%d +%d$`, regexp.QuoteMeta(queueName(qs[1])), maxes[1], maxes[1]-1),
		fmt.Sprintf(`(?m)^total +%d$`, wantLag))
	out = e.ok("", "group", "lag", "billing", "--topic", "events", ns)
	mustMatch(t, out, fmt.Sprintf(`(?m)^%s +1$`, regexp.QuoteMeta(queueName(qs[0]))), fmt.Sprintf(`(?m)^total +%d$`, wantLag))

	out = e.ok("", "group", "lag", "nobody", "--topic", "events", ns)
	mustMatch(t, out, `(?m)^total +10$`, `group nobody has committed no offset on events`)
}

// TestCLIErrors checks that bad flags, unknown topics and an unreachable
// name server fail with status 1 and a message that says what is wrong.
func TestCLIErrors(t *testing.T) {
	e := newCLIEnv(t)
	ns := "--namesrv=" + e.ns
	e.ok("", "topic", "create", "known", "--queues", "1", ns)
	dir := t.TempDir()
	cases := []struct {
		want string
		args []string
	}{
		{`unknown topic "nope"`, []string{"topic", "describe", "nope", ns}},
		{`unknown topic "nope"`, []string{"topic", "delete", "nope", ns}},
		{`unknown topic "nope"`, []string{"produce", "nope", "--body", "x", ns}},
		{`unknown topic "nope"`, []string{"consume", "nope", "--count", "1", ns}},
		{`unknown topic "nope"`, []string{"group", "lag", "g", "--topic", "nope", ns}},
		{"--queues 0: must be between 1 and 1024", []string{"topic", "create", "t", "--queues", "0", ns}},
		{`--perm "x": want rw, r or w`, []string{"topic", "create", "t", "--perm", "x", ns}},
		{"takes TOPIC (got 0 arguments)", []string{"topic", "create", ns}},
		{"takes no arguments", []string{"topic", "list", "extra", ns}},
		{"unknown flag: --bogus", []string{"topic", "list", "--bogus"}},
		{`--property "novalue": want NAME=VALUE`, []string{"produce", "known", "--property", "novalue", ns}},
		{"--file and --body exclude each other", []string{"produce", "known", "--file", "f", "--body", "b", ns}},
		{"--keys", []string{"produce", "known", "--keys", "a b", ns}},
		{`--from "yesterday"`, []string{"consume", "known", "--from", "yesterday", ns}},
		{"topic \"known\" has no readable queue 7", []string{"consume", "known", "--queue", "7", ns}},
		{"--topic is required", []string{"group", "offsets", "g", ns}},
		{"no name server reachable at 127.0.0.1:1", []string{"topic", "describe", "known", "--namesrv", "127.0.0.1:1", "--timeout", "2s"}},
		{"holds no checkpoint store", []string{"checkpoint", "list", dir}},
		{"no such file or directory", []string{"checkpoint", "inspect", filepath.Join(dir, "missing")}},
		{"give exactly one of --to-earliest", []string{"checkpoint", "reset-offsets", dir, "--to-earliest", "--to-offset", "3", "--topic", "known"}},
		{"give exactly one of --to-earliest", []string{"checkpoint", "reset-offsets", dir, "--topic", "known"}},
		{"--topic is required", []string{"checkpoint", "reset-offsets", dir, "--to-earliest"}},
		{"--to-timestamp: time \"soon\"", []string{"checkpoint", "reset-offsets", dir, "--to-timestamp", "soon", "--topic", "known"}},
		{"--out FILE is required", []string{"savepoint", "create", dir}},
		{"--stop needs --job ADDR", []string{"savepoint", "create", dir, "--stop"}},
		{"--job takes no DIR", []string{"savepoint", "create", dir, "--job", "127.0.0.1:1"}},
		{`--job "http://x:1/": want the status endpoint's host:port`, []string{"savepoint", "create", "--job", "http://x:1/"}},
		{`--job "nohost": want host:port`, []string{"savepoint", "create", "--job", "nohost"}},
		{"is the job running with its status endpoint there?", []string{"savepoint", "create", "--job", "127.0.0.1:1"}},
		{"takes FILE DIR", []string{"savepoint", "restore", "onlyone"}},
		{"savepoint: open", []string{"savepoint", "restore", filepath.Join(dir, "none.sp"), filepath.Join(dir, "x")}},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args[:min(3, len(tc.args))], " "), func(t *testing.T) {
			t.Parallel() // separate processes: overlap their start-up
			ec := *e
			ec.t = t
			ec.fails(tc.want, tc.args...)
		})
	}
}

// TestHelpTeaches checks that every command's --help has a description and
// at least one example (in process: help does no I/O).
func TestHelpTeaches(t *testing.T) {
	for _, path := range [][]string{{"topic", "create"}, {"topic", "list"}, {"topic", "describe"}, {"topic", "delete"},
		{"produce"}, {"consume"}, {"group", "offsets"}, {"group", "lag"}, {"checkpoint", "list"}, {"checkpoint", "inspect"},
		{"checkpoint", "reset-offsets"}, {"savepoint", "create"}, {"savepoint", "restore"}} {
		root := newRootCmd()
		var out strings.Builder
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(append(path, "--help"))
		if err := root.Execute(); err != nil {
			t.Fatalf("%v --help: %v\n%s", path, err, out.String())
		}
		if !strings.Contains(out.String(), "Example") || !strings.Contains(out.String(), "runnel "+strings.Join(path, " ")) {
			t.Errorf("%v --help has no example:\n%s", path, out.String())
		}
	}
}

// runWordCount runs the word-count job over topic (bounded at the queues'
// current ends) with its checkpoints in dir and returns the counts it
// emitted and the number of records its source read.
func runWordCount(t *testing.T, ctx context.Context, c *client.Client, topic, dir string) (map[string]int64, int64) {
	t.Helper()
	src, err := rocketmq.New(c, topic, rocketmq.WithStop(rocketmq.StopAtLatest()))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	counts := map[string]int64{}
	out := sink.NewFunc(func(_ context.Context, wc wordcount.WordCount) error {
		mu.Lock()
		counts[wc.Word] = wc.Count
		mu.Unlock()
		return nil
	}, nil)
	job := pipeline.New("cli-wc", pipeline.CheckpointDir(dir), pipeline.CheckpointInterval(20*time.Millisecond), pipeline.DefaultParallelism(2))
	wordcount.Build(job, src, out)
	if err := job.Run(ctx); err != nil {
		t.Fatal(err)
	}
	var read int64
	for _, o := range job.Status().Operators {
		if o.UID == "lines" {
			read = max(o.In, o.Out)
		}
	}
	return counts, read
}

// TestCheckpointCommands runs a real word-count job into a checkpoint dir,
// then lists and inspects it, resets its offsets (dry run, earliest, offset,
// timestamp), restarts the job on the reset checkpoint (its counts double:
// state kept, input re-read), and round-trips a savepoint.
func TestCheckpointCommands(t *testing.T) {
	e := newCLIEnv(t)
	ns := "--namesrv=" + e.ns
	c, err := e.cl.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const topic = "lines"
	if err := e.cl.CreateTopic(e.ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	beforeProduce := time.Now().Add(-time.Second)
	lines := wordcount.SampleLines(200, 3)
	p, err := client.NewProducer(c, "cli_test")
	if err != nil {
		t.Fatal(err)
	}
	if err := wordcount.Produce(e.ctx, c, p, topic, lines, nil); err != nil {
		t.Fatal(err)
	}
	_ = p.Close()
	dir := filepath.Join(t.TempDir(), "ckpt")
	first, read := runWordCount(t, e.ctx, c, topic, dir)
	if read != int64(len(lines)) {
		t.Fatalf("first run read %d records, want %d", read, len(lines))
	}
	want := wordcount.Count(lines)
	for w, n := range want {
		if first[w] != n {
			t.Fatalf("first run: %s=%d, want %d", w, first[w], n)
		}
	}

	list := e.ok("", "checkpoint", "list", dir)
	mustMatch(t, list, `(?m)^ID +TIME +KIND +SIZE +ORIGIN +PATH$`, `(?m)^\d+ +\S+ \S+ +latest +\d+ +checkpoint +\S+$`)
	latest := regexp.MustCompile(`(?m)^(\d+) `).FindStringSubmatch(strings.SplitN(list, "\n", 3)[1])[1]

	insp := e.ok("", "checkpoint", "inspect", dir)
	mustMatch(t, insp, `(?m)^checkpoint `+latest+` at `, `(?m)^max parallelism 128 \(key groups\)$`,
		`(?m)^  lines +broker-\S+/0 +next 100 \(stop at 100\)$`, `(?m)^  lines +broker-\S+/1 +next 100 \(stop at 100\)$`,
		`(?m)^  count +keyed-process +[1-9]\d* +[1-9]\d* +[1-9]\d*$`, `(?m)^pending sink commits:\n  SINK.*\n  \(none\)`)

	// Dry run: the diff, nothing written.
	out := e.ok("", "checkpoint", "reset-offsets", dir, "--topic", topic, "--to-earliest", "--dry-run", ns)
	mustMatch(t, out, `(?m)^  lines +broker-\S+/0 +100 +0 +-100$`, `(?m)^dry run: 2 of 2 splits would change; nothing written$`)
	sizes := regexp.MustCompile(`(latest +)\d+`) // the store's files change size when opened
	if got := e.ok("", "checkpoint", "list", dir); sizes.ReplaceAllString(got, "$1N") != sizes.ReplaceAllString(list, "$1N") {
		t.Fatalf("dry run changed the checkpoints:\n%s\nbefore:\n%s", got, list)
	}
	// To an offset (clamped to the queue), to a time before and after.
	mustMatch(t, e.ok("", "checkpoint", "reset-offsets", dir, "--topic", topic, "--to-offset", "1000", "--dry-run", ns), `(?m)^  lines +broker-\S+/1 +100 +100 +=$`)
	mustMatch(t, e.ok("", "checkpoint", "reset-offsets", dir, "--topic", topic, "--to-timestamp", beforeProduce.Format(time.RFC3339Nano), "--dry-run", ns), `(?m)^  lines +broker-\S+/1 +100 +0 +-100$`)
	mustMatch(t, e.ok("", "checkpoint", "reset-offsets", dir, "--topic", topic, "--to-timestamp", fmt.Sprint(time.Now().Add(time.Hour).UnixMilli()), "--dry-run", ns), `(?m)^  lines +broker-\S+/0 +100 +100 +=$`)
	e.fails(`unknown topic "wrongtopic"`, "checkpoint", "reset-offsets", dir, "--topic", "wrongtopic", "--to-earliest", ns)
	e.ok("", "topic", "create", "narrow", "--queues", "1", ns)
	e.fails("/1 is not a readable queue of topic narrow (wrong --topic?)", "checkpoint", "reset-offsets", dir, "--topic", "narrow", "--to-earliest", ns)
	e.fails(`has no split of source "other"`, "checkpoint", "reset-offsets", dir, "--topic", topic, "--source", "other", "--to-earliest", ns)

	out = e.ok("", "checkpoint", "reset-offsets", dir, "--topic", topic, "--source", "lines", "--to-offset", "40", ns)
	mustMatch(t, out, `(?m)^  lines +broker-\S+/0 +100 +40 +-60$`, `(?m)^wrote checkpoint \d+: 2 splits reset`)
	mustMatch(t, e.ok("", "checkpoint", "inspect", dir), `(?m)^  lines +broker-\S+/0 +next 40 \(stop at 100\)$`)
	out = e.ok("", "checkpoint", "reset-offsets", dir, "--topic", topic, "--to-earliest", ns)
	mustMatch(t, out, `(?m)^  lines +broker-\S+/1 +40 +0 +-40$`)

	// The job restores the reset checkpoint (its fingerprint matches) and
	// re-reads every record; without the reset it reads none.
	if _, read := runWordCount(t, e.ctx, c, topic, dir); read != int64(len(lines)) {
		t.Fatalf("after the reset the job read %d records, want %d", read, len(lines))
	}
	if _, read := runWordCount(t, e.ctx, c, topic, dir); read != 0 {
		t.Fatalf("without a reset the job read %d records, want 0", read)
	}

	// Savepoint round trip.
	sp := filepath.Join(t.TempDir(), "wc.savepoint")
	mustMatch(t, e.ok("", "savepoint", "create", dir, "--out", sp), `(?m)^wrote savepoint of checkpoint \d+ to .* \(\d+ bytes\)$`)
	e.fails("exists", "savepoint", "create", dir, "--out", sp)
	restored := filepath.Join(t.TempDir(), "restored")
	mustMatch(t, e.ok("", "savepoint", "restore", sp, restored), `(?m)^restored checkpoint \d+ from `)
	e.fails("already holds checkpoints", "savepoint", "restore", sp, restored)
	a, b := e.ok("", "checkpoint", "inspect", dir), e.ok("", "checkpoint", "inspect", restored)
	cut := func(s string) string { return s[strings.Index(s, "split offsets:"):] }
	if cut(a) != cut(b) {
		t.Errorf("restored savepoint differs:\n%s\n---\n%s", a, b)
	}
	mustMatch(t, e.ok("", "checkpoint", "list", restored), `savepoint restore`)
	dropped := filepath.Join(t.TempDir(), "dropped")
	e.ok("", "savepoint", "restore", sp, dropped, "--drop-operator", "count")
	mustMatch(t, e.ok("", "checkpoint", "inspect", dropped), `(?m)^  count +keyed-process +0 +0 +0$`)
}
