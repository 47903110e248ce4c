package store

import (
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// walWatchFS wraps the file system Pebble writes to and makes the store
// fail (setFailed) on the first failed write or fsync of a WAL file, before
// the error reaches Pebble.
//
// Why: Pebble's WAL writer keeps a background write or fsync error (in
// ASYNC mode nobody waits for it) and hands it to the next commit's WAL
// append, which then panics with Pebble's commit pipeline lock held: the
// process cannot go on. Since this wrapper marks the store failed first,
// and every store write checks the failure and appends to the WAL under
// walMu (commitBatch), no commit ever reaches the broken writer: the
// failure turns into ErrFailed for the writers, as in SYNC mode.
type walWatchFS struct {
	vfs.FS
	s *Store
}

// isWAL reports a Pebble WAL file name ("000123.log", also the numbered
// failover form "000123-001.log").
func isWAL(fs vfs.FS, name string) bool {
	return strings.HasSuffix(fs.PathBase(name), ".log")
}

func (fs walWatchFS) watch(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil {
		if isWAL(fs.FS, name) {
			fs.s.walFailed("create WAL", err)
		}
		return f, err
	}
	if !isWAL(fs.FS, name) {
		return f, nil
	}
	return walFile{File: f, s: fs.s}, nil
}

func (fs walWatchFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, category)
	return fs.watch(name, f, err)
}

func (fs walWatchFS) ReuseForWrite(oldname, newname string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(oldname, newname, category)
	return fs.watch(newname, f, err)
}

func (fs walWatchFS) OpenReadWrite(name string, category vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.OpenReadWrite(name, category, opts...)
	return fs.watch(name, f, err)
}

// Unwrap returns the wrapped file system.
func (fs walWatchFS) Unwrap() vfs.FS { return fs.FS }

// walFile is a WAL file whose write and fsync errors fail the store.
// (Preallocate errors are ignored by Pebble, and so here.)
type walFile struct {
	vfs.File
	s *Store
}

func (f walFile) Write(p []byte) (int, error) {
	n, err := f.File.Write(p)
	if err != nil {
		f.s.walFailed("WAL write", err)
	}
	return n, err
}

func (f walFile) WriteAt(p []byte, off int64) (int, error) {
	n, err := f.File.WriteAt(p, off)
	if err != nil {
		f.s.walFailed("WAL write", err)
	}
	return n, err
}

func (f walFile) Sync() error {
	err := f.File.Sync()
	if err != nil {
		f.s.walFailed("WAL fsync", err)
	}
	return err
}

func (f walFile) SyncData() error {
	err := f.File.SyncData()
	if err != nil {
		f.s.walFailed("WAL fsync", err)
	}
	return err
}

func (f walFile) SyncTo(length int64) (bool, error) {
	full, err := f.File.SyncTo(length)
	if err != nil {
		f.s.walFailed("WAL fsync", err)
	}
	return full, err
}
