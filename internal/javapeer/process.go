package javapeer

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one child JVM. Its owner goroutine (started by startProc) holds
// the OS thread the child was forked from for the child's whole life:
// Pdeathsig fires when that thread exits, so the child dies with the test
// binary but never because the Go runtime retired a thread.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string // file with the child's stdout and stderr

	done chan struct{} // closed when the child has exited
	err  error         // cmd.Wait's result, set before done closes

	mu struct {
		sync.Mutex
		lines []func(string) // called with every stdout line
	}
}

// newProc prepares cmd as a proc logging to logPath; register watchers,
// then start it.
func newProc(name string, cmd *exec.Cmd, logPath string) *proc {
	return &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
}

// start starts the child with its output appended to the log file and
// handed, line by line, to the watchers; onEOF (if set) runs once the
// output has ended, before done closes.
func (p *proc) start(onEOF func()) error {
	logf, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("javapeer: %w", err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		_ = logf.Close()
		return fmt.Errorf("javapeer: %w", err)
	}
	cmd := p.cmd
	cmd.Stdout, cmd.Stderr = pw, pw
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		err := cmd.Start()
		_ = pw.Close()
		started <- err
		if err != nil {
			_ = pr.Close()
			_ = logf.Close()
			if onEOF != nil {
				onEOF()
			}
			close(p.done)
			return
		}
		var reader sync.WaitGroup
		reader.Add(1)
		go func() {
			defer reader.Done()
			p.pump(pr, logf)
		}()
		werr := cmd.Wait()
		reader.Wait()
		_ = pr.Close()
		_ = logf.Close()
		if onEOF != nil {
			onEOF()
		}
		p.err = werr
		close(p.done)
	}()
	if err := <-started; err != nil {
		<-p.done
		return fmt.Errorf("javapeer: start %s: %w", p.name, err)
	}
	return nil
}

// pump copies the child's output to the log file line by line and hands
// each line to the registered watchers.
func (p *proc) pump(r io.Reader, logf io.Writer) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		_, _ = io.WriteString(logf, line+"\n")
		p.mu.Lock()
		watchers := p.mu.lines
		p.mu.Unlock()
		for _, w := range watchers {
			w(line)
		}
	}
	// The rest of the output, if a line was longer than the scanner allows.
	_, _ = io.Copy(logf, r)
}

// watch registers fn for every later output line.
func (p *proc) watch(fn func(string)) {
	p.mu.Lock()
	p.mu.lines = append(p.mu.lines[:len(p.mu.lines):len(p.mu.lines)], fn)
	p.mu.Unlock()
}

// awaitLine waits until seen (from lineSeen, registered before start)
// closes, the child exits, or timeout or ctx ends.
func (p *proc) awaitLine(ctx context.Context, seen <-chan struct{}, timeout time.Duration, want string) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-seen:
		return nil
	case <-p.done:
		return fmt.Errorf("javapeer: %s exited (%v) before printing %q; last output:\n%s", p.name, p.err, want, p.tail(40))
	case <-t.C:
		return fmt.Errorf("javapeer: %s did not print %q within %v; last output:\n%s", p.name, want, timeout, p.tail(40))
	case <-ctx.Done():
		return fmt.Errorf("javapeer: waiting for %s: %w", p.name, ctx.Err())
	}
}

// lineSeen registers a watcher for want and returns a channel closed the
// first time a line contains it.
func (p *proc) lineSeen(want string) <-chan struct{} {
	ch := make(chan struct{})
	var once sync.Once
	p.watch(func(line string) {
		if strings.Contains(line, want) {
			once.Do(func() { close(ch) })
		}
	})
	return ch
}

// tail is the last n lines of the child's log file.
func (p *proc) tail(n int) string {
	b, _ := os.ReadFile(p.log)
	return Tail(b, n)
}

// kill sends sig to the child (by its PID) and waits, bounded, for it to
// exit; a child that ignores sig is SIGKILLed.
func (p *proc) kill(sig syscall.Signal, wait time.Duration) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("javapeer: signal %s: %w", p.name, err)
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-t.C:
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	return nil
}

// pid is the child's process id.
func (p *proc) pid() int { return p.cmd.Process.Pid }
