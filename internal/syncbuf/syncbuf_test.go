package syncbuf

import (
	"strings"
	"sync"
	"testing"
)

// TestConcurrentWrites writes from several goroutines while reading (the
// race detector checks the locking) and finds every write whole.
func TestConcurrentWrites(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 100 {
				_, _ = b.Write([]byte("ab"))
				b.WriteString("cd")
			}
		})
	}
	for range 10 {
		_ = b.String()
	}
	wg.Wait()
	if got := b.String(); len(got) != 4*100*4 || strings.Count(got, "ab") != 400 || strings.Count(got, "cd") != 400 {
		t.Fatalf("buffer holds %d bytes: %q...", len(got), got[:min(len(got), 40)])
	}
}
