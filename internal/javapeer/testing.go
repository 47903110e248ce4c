package javapeer

import (
	"context"
	"os"
	"path/filepath"
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

// NewDriver returns d's driver with its logs in t.TempDir().
func (d *Dist) NewDriver(t testing.TB) *Driver {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dr, err := d.Driver(ctx, filepath.Join(t.TempDir(), "driver"))
	if err != nil {
		t.Fatal(err)
	}
	return dr
}
