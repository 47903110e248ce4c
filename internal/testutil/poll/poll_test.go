package poll

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// fakeTB records Fatalf instead of stopping the test, so Until's
// failure path can be observed.
type fakeTB struct {
	testing.TB
	failed string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Fatalf(format string, args ...any) { f.failed = fmt.Sprintf(format, args...) }

func TestUntilSucceedsOnceFnDoes(t *testing.T) {
	calls := 0
	Until(t, 5*time.Second, time.Millisecond, func() error {
		calls++
		if calls < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if calls != 3 {
		t.Fatalf("fn called %d times, want 3", calls)
	}
}

func TestUntilFailsWithLastError(t *testing.T) {
	f := &fakeTB{TB: t}
	calls := 0
	start := time.Now()
	Until(f, 50*time.Millisecond, 5*time.Millisecond, func() error {
		calls++
		if calls == 1 {
			return errors.New("first")
		}
		return errors.New("last")
	})
	if f.failed == "" {
		t.Fatal("Until did not fail")
	}
	if !strings.Contains(f.failed, "last") || strings.Contains(f.failed, "first") {
		t.Fatalf("failure %q does not report only the last error", f.failed)
	}
	if calls < 2 {
		t.Fatalf("fn called %d times, want several", calls)
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Fatalf("gave up after %v, before total", d)
	}
}
