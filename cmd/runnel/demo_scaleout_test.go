package main

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestScaleoutDemoCommand runs `runnel demo scaleout` as a real process on a
// small input: three ETL workers share the 16 tasks (8 input queues, 8
// key-group ranges), worker 2 is SIGKILLed and its tasks move to workers 1
// and 3, worker 4 starts on an empty state directory and takes tasks from
// them, restoring their state from the broker, and the verdict is
// exactly-once with exit status 0. The broker's queue locks expire after
// 60 s, as in Apache RocketMQ: the survivors release the killed worker's
// locks when they take its tasks, so that worker 4 does not wait for that
// expiry when some of them move on to it.
func TestScaleoutDemoCommand(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	cmd := runnelCmd(ctx, "demo", "scaleout", "--orders", "3000", "--customers", "50", "--interval", "100ms")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	outb, err := cmd.Output()
	out := string(outb)
	if err != nil {
		t.Fatalf("demo scaleout: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr.String())
	}
	defer func() {
		if t.Failed() {
			t.Logf("stdout:\n%s\nstderr:\n%s", out, stderr.String())
		}
	}()
	mustMatch(t, out,
		`(?m)^runnel demo: embedded name server 127\.0\.0\.1:\d+, broker 127\.0\.0\.1:\d+$`,
		`(?m)^starting 3 ETL workers of job etl as child processes .*8 input queues, 8 key-group ranges`,
		`(?m)^the workers share 16 tasks after \S+:$`,
		`(?m)^worker 4 started on an empty state directory$`,
		`(?m)^  valid orders: +\d+, each exactly once: missing 0, duplicated 0$`,
		`(?m)^  per customer: +counts in order (\d+)/(\d+), wrong values 0, unexpected 0$`,
		`(?m)^  invalid orders: +\d+, in the DLQ exactly once: missing 0, duplicated 0, unexpected 0$`,
		`(?m)^exactly-once: OK`,
		`(?m)^runnel demo: done$`)

	// The first assignment: workers 1-3 share the 16 tasks.
	first, rest, _ := strings.Cut(out, "worker 2 killed")
	if got := sumTasks(t, first, "123"); got != 16 {
		t.Errorf("the first assignment lists %d tasks, want 16", got)
	}
	// The kill and where the killed worker's tasks went.
	m := regexp.MustCompile(`(?m)^ with SIGKILL after \d+ of \d+ outputs were committed; it owned (\d+) tasks?$`).FindStringSubmatch(rest)
	if m == nil {
		t.Fatal("no kill line")
	}
	lost, _ := strconv.Atoi(m[1])
	m = regexp.MustCompile(`(?m)^worker 2's (\d+) tasks? moved in \S+: (.*); state: (.*)$`).FindStringSubmatch(rest)
	if m == nil {
		t.Fatal("no hand-off line for the killed worker")
	}
	if n, _ := strconv.Atoi(m[1]); n != lost || lost == 0 || moved(t, m[2], "to", "13") != lost {
		t.Errorf("worker 2 owned %d tasks; the hand-off says %q", lost, m[0])
	}
	// The replacement: its tasks came from workers 1 and 3, restored from
	// the broker (its state directory was empty).
	m = regexp.MustCompile(`(?m)^worker 4 took (\d+) tasks? in \S+: (.*); state: (\d+) restored from the broker\b.*$`).FindStringSubmatch(rest)
	if m == nil {
		t.Fatal("no hand-off line for the replacement")
	}
	if n, _ := strconv.Atoi(m[1]); n == 0 || moved(t, m[2], "from", "13") != n || m[3] != m[1] {
		t.Errorf("the replacement's hand-off: %q", m[0])
	}
	if strings.Contains(rest, "without the queue lock") {
		t.Error("a task moved on without its queue lock: the killed worker's locks were not released")
	}
	_, now, _ := strings.Cut(rest, "the tasks now:")
	now, _, _ = strings.Cut(now, "producing")
	if got := sumTasks(t, now, "134"); got != 16 || strings.Contains(now, "worker 2 ") {
		t.Errorf("the final assignment lists %d tasks of workers 1, 3 and 4, want 16:\n%s", got, now)
	}
}

// sumTasks adds up the task counts of the assignment lines of the given
// workers in s.
func sumTasks(t *testing.T, s, workers string) int {
	t.Helper()
	sum := 0
	for _, m := range regexp.MustCompile(`(?m)^  worker (\d) \(127\.0\.0\.1@\S+\): (\d+) tasks? \(`).FindAllStringSubmatch(s, -1) {
		if !strings.Contains(workers, m[1]) {
			t.Errorf("assignment line of worker %s, want only workers %s", m[1], workers)
		}
		n, _ := strconv.Atoi(m[2])
		sum += n
	}
	return sum
}

// moved adds up "N to worker W" (or "N from worker W") parts of a hand-off
// line, each W one of workers.
func moved(t *testing.T, s, dir, workers string) int {
	t.Helper()
	sum := 0
	for _, m := range regexp.MustCompile(`(\d+) `+dir+` worker (\d)`).FindAllStringSubmatch(s, -1) {
		if !strings.Contains(workers, m[2]) {
			t.Errorf("%q: worker %s, want one of %s", s, m[2], workers)
		}
		n, _ := strconv.Atoi(m[1])
		sum += n
	}
	return sum
}
