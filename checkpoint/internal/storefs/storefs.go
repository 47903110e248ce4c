// Package storefs carries a Pebble virtual filesystem into checkpoint.Options
// without putting a Pebble type in checkpoint's exported API. Only packages
// under checkpoint/ (its tests and checkpointtest) can build one; production
// code leaves Options.FS nil and the store uses the operating system's files.
package storefs

import "github.com/cockroachdb/pebble/v2/vfs"

// FS wraps the filesystem a checkpoint store runs on.
type FS struct {
	// VFS is the Pebble filesystem (vfs.NewCrashableMem, errorfs.Wrap, …).
	VFS vfs.FS
}

// New returns an FS for fs.
func New(fs vfs.FS) *FS { return &FS{VFS: fs} }
