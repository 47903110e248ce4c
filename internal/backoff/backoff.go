// Package backoff holds runnel's ctx-aware retry delays. It is the only
// package of the library allowed to wait on the clock for retries: every
// other package calls Sleep or Retry so that each wait honours cancellation.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Policy describes an exponential backoff with jitter. The zero value waits
// 10 ms, doubling up to 1 s, with 20 % jitter. A Policy is plain data and safe
// to share between goroutines.
type Policy struct {
	// Initial is the first delay (default 10 ms).
	Initial time.Duration
	// Max caps every delay (default 1 s).
	Max time.Duration
	// Multiplier grows the delay after each attempt (default 2).
	Multiplier float64
	// Jitter is the fraction of each delay drawn at random, 0 to 1 (default
	// 0.2); a negative value disables jitter.
	Jitter float64
}

func (p Policy) withDefaults() Policy {
	if p.Initial <= 0 {
		p.Initial = 10 * time.Millisecond
	}
	if p.Max <= 0 {
		p.Max = time.Second
	}
	if p.Max < p.Initial {
		p.Max = p.Initial
	}
	if p.Multiplier < 1 {
		p.Multiplier = 2
	}
	if p.Jitter == 0 {
		p.Jitter = 0.2
	}
	if p.Jitter < 0 {
		p.Jitter = 0
	}
	if p.Jitter > 1 {
		p.Jitter = 1
	}
	return p
}

// Delay returns the delay before retry number attempt (0 is the first retry).
// It never exceeds Max.
func (p Policy) Delay(attempt int) time.Duration {
	p = p.withDefaults()
	d := float64(p.Initial)
	for i := 0; i < attempt && d < float64(p.Max); i++ {
		d *= p.Multiplier
	}
	if d > float64(p.Max) {
		d = float64(p.Max)
	}
	if p.Jitter > 0 {
		d -= d * p.Jitter * rand.Float64()
	}
	return time.Duration(d)
}

// Sleep waits for d or until ctx is done, whichever comes first, and returns
// ctx.Err() in the latter case. A non-positive d returns at once (nil unless
// ctx is already done).
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Retry calls fn up to attempts times (at least once), waiting p.Delay
// between calls, until fn returns nil or retryable(err) is false. It returns
// the last error of fn, or ctx's error if ctx ends during a wait. A nil
// retryable retries every error.
func Retry(ctx context.Context, p Policy, attempts int, retryable func(error) bool, fn func(attempt int) error) error {
	if attempts < 1 {
		attempts = 1
	}
	var err error
	for i := range attempts {
		if err = fn(i); err == nil {
			return nil
		}
		if i == attempts-1 || (retryable != nil && !retryable(err)) {
			return err
		}
		if serr := Sleep(ctx, p.Delay(i)); serr != nil {
			return err
		}
	}
	return err
}
