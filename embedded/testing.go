package embedded

import (
	"context"
	"time"
)

// TB is the part of testing.TB that Run uses: pass the test's *testing.T
// or *testing.B. (This package does not import testing, so that programs
// that run a cluster, such as `runnel broker`, do not link it.)
type TB interface {
	Helper()
	Cleanup(func())
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	TempDir() string
}

// RunTimeout bounds Run's start of the cluster, its registration and the
// creation of its WithTopic topics.
const RunTimeout = 30 * time.Second

// Run starts a cluster for the test t as Start does, with its data in
// t.TempDir() unless WithDataDir says otherwise, and registers t.Cleanup to
// close it (an error closing it fails t). It fails t when the cluster does
// not start within RunTimeout. Call it from the test's goroutine.
func Run(t TB, opts ...Option) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), RunTimeout)
	defer cancel()
	cl, err := Start(ctx, append([]Option{WithDataDir(t.TempDir())}, opts...)...)
	if err != nil {
		t.Fatalf("embedded: %v", err)
	}
	t.Cleanup(func() {
		if err := cl.Close(); err != nil {
			t.Errorf("embedded: close: %v", err)
		}
	})
	return cl
}
