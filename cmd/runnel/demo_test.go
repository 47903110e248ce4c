package main

import (
	"cmp"
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/examples/wordcount/wordcount"
)

// TestDemoCommand runs `runnel demo wordcount` as a real process on a small input and
// checks its exit status and output: the progress bar, at least one
// completed checkpoint, the totals and the top words with their exact counts.
func TestDemoCommand(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const lines, seed = 3000, 5
	cmd := runnelCmd(ctx, "demo", "wordcount", "--lines", fmt.Sprint(lines), "--seed", fmt.Sprint(seed), "--top", "5", "--interval", "20ms")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	outb, err := cmd.Output()
	if err != nil {
		t.Fatalf("demo: %v\nstdout:\n%s\nstderr:\n%s", err, outb, stderr.String())
	}
	out := string(outb)

	counts := wordcount.Count(wordcount.SampleLines(lines, seed))
	var all []wordcount.WordCount
	var words int64
	for w, n := range counts {
		all = append(all, wordcount.WordCount{Word: w, Count: n})
		words += n
	}
	slices.SortFunc(all, func(a, b wordcount.WordCount) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Word, b.Word))
	})
	want := []string{
		`(?m)^runnel demo: embedded name server 127\.0\.0\.1:\d+, broker 127\.0\.0\.1:\d+$`,
		`producing 100% .*\(3000/3000`,
		`(?m)^checkpoint 1 completed in `,
		`(?m)^status page: http://127\.0\.0\.1:\d+/ui/ `,
		fmt.Sprintf(`(?m)^job finished in \S+: 3000 lines, %d words, %d distinct`, words, len(counts)),
		`(?m)^top 5 words:$`,
	}
	for _, wc := range all[:5] {
		want = append(want, fmt.Sprintf(`(?m)^  %s +%d$`, regexp.QuoteMeta(wc.Word), wc.Count))
	}
	want = append(want, `(?m)^runnel demo: done$`)
	for _, re := range want {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("output lacks %s", re)
		}
	}
	if t.Failed() {
		t.Logf("stdout:\n%s\nstderr:\n%s", out, stderr.String())
	}
}

// TestETLDemoCommand runs `runnel demo` (the ETL demo of `make run`) as a
// real process on a small input: it must produce, SIGKILL and restart its
// job, and report exactly-once, exiting 0.
func TestETLDemoCommand(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cmd := runnelCmd(ctx, "demo", "--orders", "3000", "--customers", "50", "--interval", "50ms")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	outb, err := cmd.Output()
	if err != nil {
		t.Fatalf("demo: %v\nstdout:\n%s\nstderr:\n%s", err, outb, stderr.String())
	}
	out := string(outb)
	for _, re := range []string{
		`(?m)^runnel demo: embedded name server 127\.0\.0\.1:\d+, broker 127\.0\.0\.1:\d+$`,
		`producing 100% .*\(3000/3000`,
		`(?m)^killed the job with SIGKILL after \d+ of \d+ outputs were committed; restarting it$`,
		`(?m)^status page: http://127\.0\.0\.1:\d+/ \(JSON at http://127\.0\.0\.1:\d+/status\) while the job runs$`,
		`(?m)^  valid orders: +\d+, each exactly once: missing 0, duplicated 0$`,
		`(?m)^  invalid orders: +\d+, in the DLQ exactly once: missing 0, duplicated 0, unexpected 0$`,
		`(?m)^exactly-once: OK`,
		`(?m)^runnel demo: done$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("output lacks %s", re)
		}
	}
	if t.Failed() {
		t.Logf("stdout:\n%s\nstderr:\n%s", out, stderr.String())
	}
}
