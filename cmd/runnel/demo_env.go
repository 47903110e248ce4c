package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/runnel-dev/runnel/embedded"
	"github.com/runnel-dev/runnel/transport/client"
)

// demoEnv is what both demos run on: a temporary directory, an embedded
// name server and broker with their data under it, and a client of them.
type demoEnv struct {
	dir string
	cl  *embedded.Cluster
	c   *client.Client
}

// startDemoEnv starts a demo's environment (with opts added to the
// cluster's) and says where it listens on out. On error it releases what it
// had started.
func startDemoEnv(ctx context.Context, out io.Writer, opts ...embedded.Option) (e *demoEnv, err error) {
	e = &demoEnv{}
	if e.dir, err = os.MkdirTemp("", "runnel-demo-"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, e.Close())
		}
	}()
	opts = append([]embedded.Option{embedded.WithDataDir(filepath.Join(e.dir, "cluster"))}, opts...)
	if e.cl, err = embedded.Start(ctx, opts...); err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "runnel demo: embedded name server %s, broker %s\n", e.cl.NameServer(), e.cl.BrokerAddr())
	if e.c, err = e.cl.NewClient(); err != nil {
		return nil, err
	}
	return e, nil
}

// Close closes the client, then the cluster, then removes the directory.
func (e *demoEnv) Close() error {
	var err error
	if e.c != nil {
		err = e.c.Close()
	}
	if e.cl != nil {
		err = errors.Join(err, e.cl.Close())
	}
	return errors.Join(err, os.RemoveAll(e.dir))
}
