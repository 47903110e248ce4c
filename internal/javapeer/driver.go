package javapeer

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

//go:embed driver/*.java
var driverFS embed.FS

// driverClass is the driver's main class.
const driverClass = "dev.runnel.javapeer.Driver"

// clientJVM are the JVM flags of a driver or mqadmin run: a small heap and
// a quick start (they live for seconds). Benchmarks pass their own.
var clientJVM = []string{"-Xms64m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto"}

// Driver runs the official Java client's flows (driver/Driver.java). It is
// safe for concurrent use; every Run or Start is its own JVM.
type Driver struct {
	dist    *Dist
	classes string
	dir     string   // user.home of the JVMs: the client's log files
	jvm     []string // JVM flags; nil: clientJVM
}

// WithJVM returns a Driver like dr whose JVMs run with flags instead of
// the small, quick-starting defaults (a benchmark's long-lived driver
// wants the full JIT and a fixed heap).
func (dr *Driver) WithJVM(flags ...string) *Driver {
	c := *dr
	c.jvm = append([]string{}, flags...)
	return &c
}

// Driver compiles the driver against d's client jars, once per source hash
// (later calls, in this process or another, reuse the classes), and returns
// a Driver whose client logs go under logDir.
func (d *Dist) Driver(ctx context.Context, logDir string) (*Driver, error) {
	h := sha256.New()
	ents, err := driverFS.ReadDir("driver")
	if err != nil {
		return nil, fmt.Errorf("javapeer: %w", err)
	}
	for _, e := range ents {
		b, _ := driverFS.ReadFile("driver/" + e.Name())
		fmt.Fprintf(h, "%s %d\n", e.Name(), len(b))
		h.Write(b)
	}
	h.Write([]byte(d.Version))
	classes := filepath.Join(filepath.Dir(d.Lib), "driver-"+hex.EncodeToString(h.Sum(nil)[:8]))
	unlock, err := lockFile(ctx, classes+".lock")
	if err != nil {
		return nil, err
	}
	defer unlock()
	if _, err := os.Stat(filepath.Join(classes, "complete")); err != nil {
		if err := d.compile(ctx, classes); err != nil {
			return nil, err
		}
	}
	return &Driver{dist: d, classes: classes, dir: logDir}, nil
}

func (d *Dist) compile(ctx context.Context, classes string) error {
	tmp := classes + ".tmp"
	_ = os.RemoveAll(tmp)
	srcDir := filepath.Join(tmp, "src")
	if err := os.MkdirAll(srcDir, 0o755); err != nil {
		return fmt.Errorf("javapeer: %w", err)
	}
	ents, err := driverFS.ReadDir("driver")
	if err != nil {
		return fmt.Errorf("javapeer: %w", err)
	}
	var srcs []string
	for _, e := range ents {
		b, _ := driverFS.ReadFile("driver/" + e.Name())
		p := filepath.Join(srcDir, e.Name())
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return fmt.Errorf("javapeer: %w", err)
		}
		srcs = append(srcs, p)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	args := append([]string{"-nowarn", "-encoding", "UTF-8", "-cp", d.Classpath(), "-d", tmp}, srcs...)
	cmd := exec.CommandContext(ctx, d.javac, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("javapeer: javac driver/*.java against RocketMQ %s: %w\n%s", d.Version, err, out)
	}
	_ = os.RemoveAll(classes)
	if err := os.Rename(tmp, classes); err != nil {
		return fmt.Errorf("javapeer: %w", err)
	}
	return os.WriteFile(filepath.Join(classes, "complete"), nil, 0o644)
}

// Event is one line the driver printed: a JSON object whose "ev" field
// names it ("sent", "recv", "check", "reply", "done", "error", …).
type Event map[string]any

// Kind is the event's "ev" field.
func (e Event) Kind() string { s, _ := e["ev"].(string); return s }

// Str is the string field k ("" if absent or not a string).
func (e Event) Str(k string) string { s, _ := e[k].(string); return s }

// Int is the numeric field k (0 if absent).
func (e Event) Int(k string) int64 {
	switch v := e[k].(type) {
	case float64:
		return int64(v)
	case json.Number:
		n, _ := v.Int64()
		return n
	case string:
		var n int64
		_, _ = fmt.Sscan(v, &n)
		return n
	}
	return 0
}

// Props is the message properties field ("props") as strings.
func (e Event) Props() map[string]string {
	m, _ := e["props"].(map[string]any)
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = fmt.Sprint(v)
	}
	return out
}

// Proc is one running driver command. Events arrive on Events in order;
// the channel closes when the JVM has exited, and Wait then returns its
// result.
type Proc struct {
	p       *proc
	events  chan Event
	watched chan struct{} // closed when the ctx watcher has returned
	mu      sync.Mutex
	bad     []string // lines that are not JSON objects (stack traces)
}

// Start runs `Driver <command> --namesrv namesrv <args>` in a new JVM.
// Events buffer without bound only up to what the command prints (every
// command's output is bounded by its --count). The caller must Wait (or
// Kill) the Proc.
func (dr *Driver) Start(ctx context.Context, namesrv, command string, args ...string) (*Proc, error) {
	if len(args)%2 != 0 {
		return nil, errors.New("javapeer: driver args come in --flag value pairs")
	}
	cp := dr.classes + string(os.PathListSeparator) + dr.dist.Classpath()
	jvm := clientJVM
	if dr.jvm != nil {
		jvm = dr.jvm
	}
	// Each JVM logs under logs/rocketmqlogs/<command>-<ns>/: the 4.9
	// client to rocketmq_client.log by rocketmq.client.logRoot, the 5.x
	// one (which finds the broker's logback configuration first on this
	// classpath) to remoting.log and broker_default.log by brokerLogDir.
	sub := fmt.Sprintf("%s-%d", command, time.Now().UnixNano())
	argv := append(append([]string{}, jvm...), "-Duser.home="+dr.dir, "-Drocketmq.client.logUseSlf4j=false",
		"-Drocketmq.client.logRoot="+filepath.Join(dr.dir, "logs", "rocketmqlogs", sub), "-DbrokerLogDir=/"+sub,
		"-cp", cp, driverClass, command, "--namesrv", namesrv)
	argv = append(argv, args...)
	cmd := exec.Command(dr.dist.Java, argv...)
	cmd.Dir = dr.dir
	cmd.Env = append(os.Environ(), "ROCKETMQ_HOME="+dr.dist.Home)
	if err := os.MkdirAll(dr.dir, 0o755); err != nil {
		return nil, fmt.Errorf("javapeer: %w", err)
	}
	logPath := filepath.Join(dr.dir, fmt.Sprintf("driver-%s.out", sub))
	pr := &Proc{events: make(chan Event, 1<<16), watched: make(chan struct{})}
	var lines sync.WaitGroup
	lines.Add(1)
	var ch = make(chan string, 1024)
	go func() {
		defer lines.Done()
		defer close(pr.events)
		for line := range ch {
			var ev Event
			if strings.HasPrefix(line, "{") && json.Unmarshal([]byte(line), &ev) == nil {
				pr.events <- ev
				continue
			}
			pr.mu.Lock()
			if len(pr.bad) < 200 {
				pr.bad = append(pr.bad, line)
			}
			pr.mu.Unlock()
		}
	}()
	p := newProc(command, cmd, logPath)
	p.watch(func(line string) { ch <- line })
	if err := p.start(func() { close(ch); lines.Wait() }); err != nil {
		return nil, err
	}
	pr.p = p
	go func() {
		defer close(pr.watched)
		select {
		case <-ctx.Done():
			_ = p.kill(syscall.SIGKILL, 5*time.Second)
		case <-p.done:
		}
	}()
	return pr, nil
}

// Events delivers the driver's events in order.
func (pr *Proc) Events() <-chan Event { return pr.events }

// Next returns the next event of kind (skipping others), or an error when
// the JVM exits first or ctx ends.
func (pr *Proc) Next(ctx context.Context, kind string) (Event, error) {
	for {
		select {
		case ev, ok := <-pr.events:
			if !ok {
				return nil, fmt.Errorf("javapeer: driver exited before a %q event: %v\n%s", kind, pr.Wait(), pr.Output())
			}
			if ev.Kind() == "error" {
				return nil, fmt.Errorf("javapeer: driver error: %s\n%s", ev.Str("error"), pr.Output())
			}
			if ev.Kind() == kind {
				return ev, nil
			}
		case <-ctx.Done():
			return nil, fmt.Errorf("javapeer: waiting for a %q event: %w\n%s", kind, ctx.Err(), pr.Output())
		}
	}
}

// Wait waits for the JVM to exit and returns nil if it exited 0.
func (pr *Proc) Wait() error {
	<-pr.p.done
	<-pr.watched
	if pr.p.err != nil {
		return fmt.Errorf("javapeer: driver: %w", pr.p.err)
	}
	return nil
}

// Kill SIGKILLs the JVM and waits for it.
func (pr *Proc) Kill() { _ = pr.p.kill(syscall.SIGKILL, 5*time.Second) }

// Output is the tail of what the JVM printed that is not an event (its
// stack traces), for error messages.
func (pr *Proc) Output() string {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return Tail([]byte(strings.Join(pr.bad, "\n")), 40)
}

// Run runs a driver command to its end and returns every event it printed,
// or an error (with its output) if it exited non-zero or printed an
// "error" event.
func (dr *Driver) Run(ctx context.Context, namesrv, command string, args ...string) ([]Event, error) {
	pr, err := dr.Start(ctx, namesrv, command, args...)
	if err != nil {
		return nil, err
	}
	var evs []Event
	for ev := range pr.Events() {
		evs = append(evs, ev)
	}
	werr := pr.Wait()
	for _, ev := range evs {
		if ev.Kind() == "error" {
			return evs, fmt.Errorf("javapeer: driver %s: %s\n%s", command, ev.Str("error"), pr.Output())
		}
	}
	if werr != nil {
		return evs, fmt.Errorf("%w\n%s", werr, pr.Output())
	}
	if ctx.Err() != nil {
		return evs, fmt.Errorf("javapeer: driver %s: %w", command, ctx.Err())
	}
	return evs, nil
}

// Admin runs the real mqadmin (MQAdminStartup) with args against the name
// server namesrv and returns what it printed. mqadmin exits 0 even when a
// command fails, so callers check the output too; a non-zero exit or a
// printed Java exception is returned as an error.
func (d *Dist) Admin(ctx context.Context, logDir, namesrv string, args ...string) (string, error) {
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return "", fmt.Errorf("javapeer: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	argv := append(append([]string{}, clientJVM...), "-Duser.home="+logDir, "-Drocketmq.namesrv.addr="+namesrv,
		"-Drocketmq.home.dir="+d.Home, "-cp", d.Classpath(), "org.apache.rocketmq.tools.command.MQAdminStartup")
	argv = append(argv, args...)
	cmd := exec.CommandContext(ctx, d.Java, argv...)
	cmd.Dir = logDir
	cmd.Env = append(os.Environ(), "ROCKETMQ_HOME="+d.Home, "NAMESRV_ADDR="+namesrv)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	s := out.String()
	if err != nil {
		return s, fmt.Errorf("javapeer: mqadmin %s: %w\n%s", strings.Join(args, " "), err, Tail(out.Bytes(), 40))
	}
	if exceptionLine(s) {
		return s, fmt.Errorf("javapeer: mqadmin %s failed:\n%s", strings.Join(args, " "), Tail(out.Bytes(), 40))
	}
	return s, nil
}

// exceptionLine reports whether some line of s starts like a Java
// exception report ("org.apache…Exception: …" or "…Exception:" after a
// command's own error prefix).
func exceptionLine(s string) bool {
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(l, "at ") {
			return true
		}
		if f, _, ok := strings.Cut(l, ":"); ok && strings.HasSuffix(f, "Exception") && !strings.Contains(f, " ") {
			return true
		}
	}
	return false
}
