//go:build failpoints

package postgres

import "github.com/runnel-dev/runnel/internal/failpoint"

// WithFaults enables deliberate defects and delays (failpoints build tag
// only; see internal/failpoint).
func WithFaults(f failpoint.Postgres) Option { return optionFunc(func(c *config) { c.faults = f }) }
