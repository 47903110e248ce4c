package main

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/runnel-dev/runnel/examples/wordcount/wordcount"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestWordCountExample runs the example end to end (embedded broker, sample
// text, bounded job) and checks every printed count against a direct count.
func TestWordCountExample(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	if err := run(ctx, []string{"-lines", "2000", "-seed", "7", "-interval", "100ms", "-data", t.TempDir()}, &stdout, &stderr); err != nil {
		t.Fatalf("%v\nstderr:\n%s", err, stderr.String())
	}
	var want []string
	for w, n := range wordcount.Count(wordcount.SampleLines(2000, 7)) {
		want = append(want, wordcount.WordCount{Word: w, Count: n}.String())
	}
	got := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("output differs:\ngot  %q\nwant %q", got, want)
	}
	if !strings.Contains(stderr.String(), "wordcount: done in") {
		t.Fatalf("no summary on stderr: %q", stderr.String())
	}
}
