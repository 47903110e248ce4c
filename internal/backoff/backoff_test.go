package backoff

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestDelayGrowsAndCaps(t *testing.T) {
	p := Policy{Initial: time.Millisecond, Max: 8 * time.Millisecond, Jitter: -1}
	want := []time.Duration{1, 2, 4, 8, 8, 8}
	for i, w := range want {
		if got := p.Delay(i); got != w*time.Millisecond {
			t.Fatalf("Delay(%d) = %v, want %v", i, got, w*time.Millisecond)
		}
	}
	j := Policy{Initial: 10 * time.Millisecond, Jitter: 0.5}
	for range 100 {
		if d := j.Delay(0); d < 5*time.Millisecond || d > 10*time.Millisecond {
			t.Fatalf("jittered delay %v out of [5ms,10ms]", d)
		}
	}
}

func TestSleepHonoursContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	if err := Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("Sleep on a cancelled ctx = %v", err)
	}
	if time.Since(start) > time.Second {
		t.Fatal("Sleep did not return promptly")
	}
	if err := Sleep(context.Background(), time.Millisecond); err != nil {
		t.Fatal(err)
	}
}

func TestRetry(t *testing.T) {
	p := Policy{Initial: time.Microsecond}
	calls := 0
	boom := errors.New("boom")
	err := Retry(context.Background(), p, 3, nil, func(int) error { calls++; return boom })
	if !errors.Is(err, boom) || calls != 3 {
		t.Fatalf("err=%v calls=%d", err, calls)
	}
	calls = 0
	err = Retry(context.Background(), p, 5, nil, func(a int) error {
		calls++
		if a < 2 {
			return boom
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("err=%v calls=%d", err, calls)
	}
	calls = 0
	err = Retry(context.Background(), p, 5, func(error) bool { return false }, func(int) error { calls++; return boom })
	if !errors.Is(err, boom) || calls != 1 {
		t.Fatalf("non-retryable: err=%v calls=%d", err, calls)
	}
}
