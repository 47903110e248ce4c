package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/embedded"
	"github.com/runnel-dev/runnel/internal/syncbuf"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/internal/testutil/testcert"
	"github.com/runnel-dev/runnel/runtime"
	"github.com/runnel-dev/runnel/transport/acl"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// TestMain runs main() when the test binary is re-executed as the
// example's process (RUNNEL_FIRSTJOB_MAIN=1, the arguments after "--").
func TestMain(m *testing.M) {
	if os.Getenv("RUNNEL_FIRSTJOB_MAIN") == "1" {
		for i, a := range os.Args {
			if a == "--" {
				os.Args = append([]string{"firstjob"}, os.Args[i+1:]...)
				break
			}
		}
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestReadmeFirstJobIsTheExample: the README's "Your first job" code is
// this example's main.go, byte for byte (so the README's code is compiled
// and tested in CI).
func TestReadmeFirstJobIsTheExample(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	const marker = "<!-- the code of examples/firstjob/main.go -->\n```go\n"
	_, block, ok := strings.Cut(string(readme), marker)
	if !ok {
		t.Fatalf("README.md has no %q block", marker)
	}
	block, _, ok = strings.Cut(block, "\n```\n")
	if !ok {
		t.Fatal("README.md's first-job block is not closed")
	}
	if block+"\n" != string(src) {
		t.Fatalf("README.md's first-job code differs from examples/firstjob/main.go: copy main.go into the README block\n--- README:\n%s", block)
	}
}

// jobProc is the example running as a process.
type jobProc struct {
	cmd    *exec.Cmd
	stdout chan string // lines
	stderr *syncbuf.Buffer
	status string // status endpoint address
}

func startJob(t *testing.T, ctx context.Context, env []string, args ...string) *jobProc {
	t.Helper()
	cmd := exec.CommandContext(ctx, os.Args[0], append([]string{"-test.run=^$", "--", "-status", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(append(os.Environ(), "RUNNEL_FIRSTJOB_MAIN=1"), env...)
	p := &jobProc{cmd: cmd, stdout: make(chan string, 100), stderr: &syncbuf.Buffer{}}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { // ends when the process closes stdout
		defer close(p.stdout)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.stdout <- sc.Text()
		}
	}()
	re := regexp.MustCompile(`status page: http://(\S+)/ui/`)
	testutil.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		if m := re.FindStringSubmatch(p.stderr.String()); m != nil {
			p.status = m[1]
			return nil
		}
		return fmt.Errorf("no status page line; stderr:\n%s", p.stderr.String())
	})
	return p
}

// lines waits until the job printed want (in any order) and returns them.
func (p *jobProc) lines(t *testing.T, want ...string) {
	t.Helper()
	var got []string
	deadline := time.After(30 * time.Second)
	for len(got) < len(want) {
		select {
		case l, ok := <-p.stdout:
			if !ok {
				t.Fatalf("the job ended; printed %q, want %q; stderr:\n%s", got, want, p.stderr.String())
			}
			got = append(got, l)
		case <-deadline:
			t.Fatalf("printed %q, want %q; stderr:\n%s", got, want, p.stderr.String())
		}
	}
	slices.Sort(got)
	want = slices.Clone(want)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("printed %q, want %q", got, want)
	}
}

// stop sends SIGTERM and expects a clean exit (the stop checkpoint).
func (p *jobProc) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for range p.stdout {
	}
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("the job did not stop cleanly: %v\nstderr:\n%s", err, p.stderr.String())
	}
}

func (p *jobProc) statusDoc(t *testing.T) runtime.StatusDocument {
	t.Helper()
	var doc runtime.StatusDocument
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + p.status + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

// clicks sends the bodies to queue 0 of topic, in order.
func clicks(t *testing.T, c *client.Client, topic string, bodies ...string) {
	t.Helper()
	p, err := client.NewProducer(c, "firstjob_test")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := c.RefreshRoute(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	q := protocol.MessageQueue{Topic: topic, BrokerName: r.BrokerNames()[0], QueueID: 0}
	for _, b := range bodies {
		if _, err := p.Send(ctx, &client.Message{Topic: topic, Queue: &q, Body: []byte(b)}); err != nil {
			t.Fatal(err)
		}
	}
}

func click(user, ts string) string {
	return fmt.Sprintf(`{"user":%q,"page":"/home","ts":"2025-05-01T12:00:%sZ"}`, user, ts)
}

// TestFirstJob runs the README's first job as a process against an
// embedded cluster, as the README does against `runnel broker`: clicks in
// one queue of two (the other stays empty and turns idle), a bad event and
// one without a timestamp to stderr as dead letters, windows printed, a
// late click after they fired printed as late, and the status endpoint
// showing the bytes source's lag, decoded offsets, the window's watermark
// and its late record. Stopped with SIGTERM and started again on the same
// state, it resumes: the window still open at the stop fires with the
// click it held.
func TestFirstJob(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cl := embedded.Run(t, embedded.WithTopic("clicks", 2))
	state := t.TempDir()
	args := []string{"-namesrv", cl.NameServer(), "-topic", "clicks", "-state", state}

	job := startJob(t, ctx, nil, args...)
	clicks(t, cl.Client(), "clicks", click("ann", "01"), click("bob", "02"), click("ann", "04"), `{"user":"ann",`,
		`{"user":"carl","page":"/"}`, click("ann", "12"), click("bob", "15"), click("ann", "31"))
	// The empty queue turns idle after 5 s; then the watermark (12:00:29)
	// fires the first two windows.
	job.lines(t, "ann 12:00:00-12:00:10 2", "bob 12:00:00-12:00:10 1", "ann 12:00:10-12:00:20 1", "bob 12:00:10-12:00:20 1")
	clicks(t, cl.Client(), "clicks", click("bob", "05"))
	job.lines(t, "late bob 12:00:05")
	for _, want := range []string{
		"bad click in broker-a/0: decode: cannot decode JSON into main.Click: unexpected end of JSON input",
		"bad click in broker-a/0: validate: Key: 'Click.TS' Error:Field validation for 'TS' failed on the 'required' tag",
	} {
		if !strings.Contains(job.stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, job.stderr.String())
		}
	}
	testutil.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		doc := job.statusDoc(t)
		var errs []string
		for _, l := range doc.Lag {
			if l.Lag < 0 {
				errs = append(errs, fmt.Sprintf("split %s: lag unknown", l.Split))
			}
		}
		if len(doc.Lag) != 2 {
			errs = append(errs, fmt.Sprintf("%d splits with lag", len(doc.Lag)))
		}
		offsets := map[string]string{}
		for _, s := range doc.Splits {
			offsets[s.Split] = s.Offset
		}
		if offsets["broker-a/0"] != "next 9" || offsets["broker-a/1"] != "next 0" {
			errs = append(errs, fmt.Sprintf("checkpointed offsets %v", offsets))
		}
		for _, o := range doc.Operators {
			if o.UID == "clicks-per-user" {
				if o.Late != 1 || o.Watermark == nil || !o.Watermark.Equal(time.Date(2025, 5, 1, 12, 0, 29, 0, time.UTC).Add(-time.Nanosecond)) {
					errs = append(errs, fmt.Sprintf("window operator: late %d, watermark %v", o.Late, o.Watermark))
				}
			}
			if o.UID == "clicks" && o.Errors != 2 {
				errs = append(errs, fmt.Sprintf("source rejected %d", o.Errors))
			}
		}
		if len(errs) > 0 {
			return fmt.Errorf("%s", strings.Join(errs, "; "))
		}
		return nil
	})
	job.stop(t)

	// Restarted on the same state: ann's window [30, 40) was open with
	// one click; a click at 12:00:52 fires it.
	job = startJob(t, ctx, nil, args...)
	clicks(t, cl.Client(), "clicks", click("ann", "52"))
	job.lines(t, "ann 12:00:30-12:00:40 1")
	job.stop(t)
}

// TestFirstJobACLAndTLS runs the first job against a cluster that requires
// ACL signatures and TLS, as the README's second step does against an
// existing RocketMQ cluster: credentials from the environment, the
// cluster's CA from -tls-ca.
func TestFirstJobACLAndTLS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg, err := acl.ParseConfig([]byte(`{"accounts":[{"accessKey":"admin-ak","secretKey":"admin-secret","admin":true},
		{"accessKey":"clicks-ak","secretKey":"clicks-secret","defaultTopicPerm":"SUB","defaultGroupPerm":"SUB"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	policy, err := acl.NewPolicy(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cert := testcert.New(t, "cluster")
	files := cert.WriteFiles(t, t.TempDir())
	cl := embedded.Run(t, embedded.WithTopic("clicks", 2), embedded.WithACL(policy, acl.Credentials{AccessKey: "admin-ak", SecretKey: "admin-secret"}),
		embedded.WithTLS(acl.TLSEnforcing, cert.ServerTLS()))
	args := []string{"-namesrv", cl.NameServer(), "-topic", "clicks", "-state", t.TempDir(), "-tls-ca", files.CA}

	// Without credentials the cluster refuses the job.
	refused := exec.CommandContext(ctx, os.Args[0], append([]string{"-test.run=^$", "--", "-status", "127.0.0.1:0"}, args...)...)
	refused.Env = append(os.Environ(), "RUNNEL_FIRSTJOB_MAIN=1")
	if out, err := refused.CombinedOutput(); err == nil || !strings.Contains(string(out), "firstjob: ") {
		t.Fatalf("without ACL credentials: %v\n%s", err, out)
	} else {
		t.Logf("without credentials: %s", out)
	}

	job := startJob(t, ctx, []string{"ROCKETMQ_ACCESS_KEY=clicks-ak", "ROCKETMQ_SECRET_KEY=clicks-secret"}, args...)
	clicks(t, cl.Client(), "clicks", click("ann", "01"), click("ann", "12"))
	job.lines(t, "ann 12:00:00-12:00:10 1")
	job.stop(t)
}
