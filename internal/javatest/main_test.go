package javatest

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/javapeer"
)

// shared holds the Java clusters tests share: booting one takes 5–20 s on
// two cores, so each version's is started once per test binary, on first
// use, and closed by TestMain. Tests on a shared cluster use topics and
// groups of their own (uniqueName).
var shared struct {
	mu       sync.Mutex
	clusters map[string]*javapeer.Cluster
	errs     map[string]error
	dirs     []string
}

func TestMain(m *testing.M) {
	code := m.Run()
	shared.mu.Lock()
	for _, c := range shared.clusters {
		_ = c.Close()
	}
	for _, d := range shared.dirs {
		_ = os.RemoveAll(d)
	}
	shared.mu.Unlock()
	os.Exit(code)
}

// javaCluster returns the shared Java name server + broker of version v
// (javapeer.Version5 or Version4), starting it on first use, with its
// Dist. It skips t where Java or Maven is missing. A cluster that failed to
// start fails every test that asks for it, with the first error.
func javaCluster(t testing.TB, v string) (*javapeer.Dist, *javapeer.Cluster) {
	t.Helper()
	d := javapeer.RequireVersion(t, v)
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if err := shared.errs[v]; err != nil {
		t.Fatalf("shared Apache RocketMQ %s cluster: %v", v, err)
	}
	if c := shared.clusters[v]; c != nil {
		return d, c
	}
	dir, err := os.MkdirTemp("", "runnel-javatest-"+v+"-")
	if err != nil {
		t.Fatal(err)
	}
	shared.dirs = append(shared.dirs, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c, err := d.StartCluster(ctx, dir)
	if err != nil {
		if shared.errs == nil {
			shared.errs = map[string]error{}
		}
		shared.errs[v] = err
		t.Fatalf("shared Apache RocketMQ %s cluster: %v", v, err)
	}
	if shared.clusters == nil {
		shared.clusters = map[string]*javapeer.Cluster{}
	}
	shared.clusters[v] = c
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("Apache RocketMQ %s logs (shared cluster in %s):\n%s", v, dir, c.Logs())
		}
	})
	return d, c
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

// uniqueName is a topic or group name of t's own (RocketMQ allows
// [A-Za-z0-9_-]{1,127}), so that tests can share a cluster.
func uniqueName(t testing.TB, prefix string) string {
	t.Helper()
	n := unsafeName.ReplaceAllString(prefix+"_"+t.Name(), "_")
	n = fmt.Sprintf("%s_%d", n, time.Now().UnixNano()%1_000_000)
	if len(n) > 120 {
		n = n[len(n)-120:]
	}
	return n
}
