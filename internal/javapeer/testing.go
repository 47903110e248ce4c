package javapeer

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Require returns the pinned 5.x Dist for a test, fetching it on first
// use. It skips t, saying why, when java, javac or mvn is missing or
// RUNNEL_TEST_JAVA=0, and fails t when they are present but the artifacts
// cannot be fetched.
func Require(t testing.TB) *Dist { t.Helper(); return RequireVersion(t, Version5) }

// RequireVersion is Require for a given pinned version.
func RequireVersion(t testing.TB, version string) *Dist {
	t.Helper()
	if os.Getenv("RUNNEL_TEST_JAVA") == "0" {
		t.Skip("javapeer: RUNNEL_TEST_JAVA=0: Apache RocketMQ Java-peer tests skipped")
	}
	if err := Tools(); err != nil {
		t.Skipf("%v: the Apache RocketMQ Java-peer tests need Java 11+ and Maven", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), fetchTimeout)
	defer cancel()
	d, err := Fetch(ctx, version)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// RunCluster starts a cluster of d in t.TempDir() and closes it at the end
// of the test; on failure of the test the tail of the broker's log is
// logged. It fails t if the cluster does not boot.
func (d *Dist) RunCluster(t testing.TB, opts ...Option) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*bootTimeout)
	defer cancel()
	c, err := d.StartCluster(ctx, t.TempDir(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("Apache RocketMQ %s logs:\n%s", d.Version, c.Logs())
		}
		_ = c.Close()
	})
	return c
}

// NewDriver returns d's driver with its logs in t.TempDir(); on failure
// of the test, what each driver JVM's client logged about warnings,
// errors and closed connections (where it says why it closed a
// connection or gave up on a call) is logged.
func (d *Dist) NewDriver(t testing.TB) *Driver {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "driver")
	dr, err := d.Driver(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("Apache RocketMQ %s client logs (every driver JVM of the test), warnings and connection events:\n%s",
				d.Version, clientLogEvents(filepath.Join(dir, "logs", "rocketmqlogs"), 40))
		}
	})
	return dr
}

// clientLogEvents returns, for each driver JVM's log file under dir (see
// Driver.Start), its last n lines that tell a warning, an error or a
// connection's closing (without stack frames).
func clientLogEvents(dir string, n int) string {
	files, err := filepath.Glob(filepath.Join(dir, "*", "*.log"))
	if err != nil || len(files) == 0 {
		return "(no client log in " + dir + ")"
	}
	var out strings.Builder
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			fmt.Fprintf(&out, "%s: %v\n", rel(dir, f), err)
			continue
		}
		var keep []string
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), "at ") {
				continue
			}
			if strings.Contains(l, " WARN ") || strings.Contains(l, " ERROR ") || strings.Contains(l, "Exception") ||
				strings.Contains(l, "CLOSE") || strings.Contains(l, "closeChannel") {
				keep = append(keep, l)
			}
		}
		fmt.Fprintf(&out, "%s (%d of %d such lines):\n", rel(dir, f), min(n, len(keep)), len(keep))
		for _, l := range keep[max(0, len(keep)-n):] {
			out.WriteString(l + "\n")
		}
	}
	return out.String()
}

// rel is f relative to dir, or f.
func rel(dir, f string) string {
	if r, err := filepath.Rel(dir, f); err == nil {
		return r
	}
	return f
}
