package interop

import (
	"testing"

	"github.com/runnel-dev/runnel/internal/failpoint"
)

// requireFailpoints skips a test that injects faults or kills at protocol
// phases when they are not compiled in (the failpoints build tag, which
// make test sets).
func requireFailpoints(t testing.TB) {
	t.Helper()
	if !failpoint.Enabled {
		t.Skip("needs the failpoints build tag (make test sets it): faults and phase hooks are compiled out")
	}
}
