package checkpoint

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// Restore points. The committed data of a store is its latest checkpoint;
// besides it a job directory may hold:
//
//	retained/<id, 20 digits>/     a retained copy of checkpoint id: a Pebble
//	                              checkpoint of the store (hard links of its
//	                              SSTs, copies of its WAL and MANIFEST) taken
//	                              right after the commit, with
//	                              runnel-checkpoint.json (its metadata)
//	savepoints/sp-<id>.savepoint  a savepoint file (savepoint.go) of
//	                              checkpoint id, written by the job on request
//
// Both are self-contained: a retained copy is a complete Pebble database, a
// savepoint file a complete stream of the checkpoint's offsets, pending sink
// commits and state. RestoreFrom makes any of them the store's latest
// checkpoint again.
const (
	// RetainedDir is the subdirectory of a store holding retained copies.
	RetainedDir = "retained"
	// SavepointDir is the subdirectory of a store holding the savepoints a
	// running job wrote (SavepointPath).
	SavepointDir = "savepoints"
	copyMetaFile = "runnel-checkpoint.json"
)

// Kinds of RestorePoint.
const (
	KindLatest    = "latest"    // the store's committed data
	KindRetained  = "retained"  // a retained copy (KeepCopy)
	KindSavepoint = "savepoint" // a savepoint file
)

// keyApplied holds the spec of the last RestoreFrom that completed, so that
// a job restarted with the same restore option resumes from its latest
// checkpoint instead of going back again.
var keyApplied = []byte{famSystem, 'a'}

// RestorePoint is a checkpoint a job can be restored from.
type RestorePoint struct {
	ID   uint64    `json:"id"`
	Time time.Time `json:"time"`
	Kind string    `json:"kind"`
	// Size is the bytes of its files (a retained copy shares most of them
	// with the store through hard links).
	Size int64 `json:"size"`
	// Path is its directory (retained) or file (savepoint); the store's
	// directory for the latest.
	Path     string   `json:"path"`
	Metadata Metadata `json:"metadata"`
}

// SavepointPath is where a running job writes the savepoint of checkpoint
// id in the store in dir.
func SavepointPath(dir string, id uint64) string {
	return filepath.Join(dir, SavepointDir, fmt.Sprintf("sp-%020d.savepoint", id))
}

func copyPath(dir string, id uint64) string {
	return filepath.Join(dir, RetainedDir, fmt.Sprintf("%020d", id))
}

// KeepCopy makes a retained copy of the latest completed checkpoint (see
// Options.KeepCopies) and removes the oldest copies beyond KeepCopies. It
// blocks commits while Pebble links the SSTs and copies the WAL and
// MANIFEST (their size is bounded by the memtable's). Call it right after
// Commit, from the goroutine that commits.
func (s *Store) KeepCopy() (RestorePoint, error) {
	if s.opts.FS != nil || s.opts.readOnly {
		return RestorePoint{}, fmt.Errorf("%w: retained copies need a writable store on the OS's files", ErrInvalid)
	}
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	if s.closed() {
		return RestorePoint{}, ErrClosed
	}
	m, ok := s.Latest()
	if !ok {
		return RestorePoint{}, errors.New("checkpoint: no completed checkpoint to retain")
	}
	parent := filepath.Join(s.dir, RetainedDir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return RestorePoint{}, fmt.Errorf("checkpoint: retain: %w", err)
	}
	final := copyPath(s.dir, m.ID)
	if _, err := os.Stat(final); err == nil {
		return s.copyPoint(final)
	}
	tmp := filepath.Join(parent, fmt.Sprintf(".tmp-%020d", m.ID))
	if err := os.RemoveAll(tmp); err != nil {
		return RestorePoint{}, fmt.Errorf("checkpoint: retain: %w", err)
	}
	if err := s.db.Checkpoint(tmp); err != nil {
		_ = os.RemoveAll(tmp) // partial
		return RestorePoint{}, fmt.Errorf("checkpoint: retain %d: %w", m.ID, err)
	}
	mb, err := json.Marshal(m)
	if err == nil {
		err = writeFileSync(filepath.Join(tmp, copyMetaFile), mb)
	}
	if err == nil {
		err = os.Rename(tmp, final)
	}
	if err == nil {
		err = syncDir(parent)
	}
	if err != nil {
		_ = os.RemoveAll(tmp) // partial
		return RestorePoint{}, fmt.Errorf("checkpoint: retain %d: %w", m.ID, err)
	}
	if err := s.pruneCopies(); err != nil {
		return RestorePoint{}, err
	}
	return s.copyPoint(final)
}

func (s *Store) copyPoint(path string) (RestorePoint, error) {
	rp, err := readCopy(path)
	if err != nil {
		return RestorePoint{}, err
	}
	return rp, nil
}

// pruneCopies removes the oldest retained copies beyond KeepCopies (and
// leftovers of interrupted copies).
func (s *Store) pruneCopies() error {
	parent := filepath.Join(s.dir, RetainedDir)
	ents, err := os.ReadDir(parent)
	if err != nil {
		return fmt.Errorf("checkpoint: retain: %w", err)
	}
	var ids []uint64
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".tmp-") {
			if err := os.RemoveAll(filepath.Join(parent, e.Name())); err != nil {
				return fmt.Errorf("checkpoint: retain: %w", err)
			}
			continue
		}
		if id, err := strconv.ParseUint(e.Name(), 10, 64); err == nil && e.IsDir() {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for len(ids) > max(s.opts.KeepCopies, 0) {
		if err := os.RemoveAll(copyPath(s.dir, ids[0])); err != nil {
			return fmt.Errorf("checkpoint: retain: %w", err)
		}
		ids = ids[1:]
	}
	return nil
}

// readCopy reads a retained copy's metadata file and size.
func readCopy(path string) (RestorePoint, error) {
	b, err := os.ReadFile(filepath.Join(path, copyMetaFile))
	if err != nil {
		return RestorePoint{}, fmt.Errorf("checkpoint: retained copy %s: %w", path, err)
	}
	var m Metadata
	if err := json.Unmarshal(b, &m); err != nil {
		return RestorePoint{}, fmt.Errorf("%w: retained copy %s: %w", ErrCorrupt, path, err)
	}
	size, err := dirSize(path)
	if err != nil {
		return RestorePoint{}, err
	}
	return RestorePoint{ID: m.ID, Time: m.Time, Kind: KindRetained, Size: size, Path: path, Metadata: m}, nil
}

func dirSize(path string) (int64, error) {
	var n int64
	err := filepath.WalkDir(path, func(_ string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err == nil {
			n += fi.Size()
		}
		return err
	})
	return n, err
}

// readSavepointPoint reads a savepoint file's header.
func readSavepointPoint(path string) (RestorePoint, error) {
	fh, err := os.Open(path)
	if err != nil {
		return RestorePoint{}, fmt.Errorf("checkpoint: savepoint: %w", err)
	}
	defer fh.Close()
	_, m, err := readSavepointHeader(bufio.NewReader(fh))
	if err != nil {
		return RestorePoint{}, fmt.Errorf("%s: %w", path, err)
	}
	fi, err := fh.Stat()
	if err != nil {
		return RestorePoint{}, err
	}
	return RestorePoint{ID: m.ID, Time: m.Time, Kind: KindSavepoint, Size: fi.Size(), Path: path, Metadata: m}, nil
}

// ListRestorePoints lists the retained copies and the savepoints of the
// store in dir, newest first (a savepoint before a retained copy of the same
// id). It reads files only, so it works while the job runs; the latest
// checkpoint is the store's (Store.Latest).
func ListRestorePoints(dir string) ([]RestorePoint, error) {
	var out []RestorePoint
	ents, err := os.ReadDir(filepath.Join(dir, RetainedDir))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	for _, e := range ents {
		if _, perr := strconv.ParseUint(e.Name(), 10, 64); perr != nil || !e.IsDir() {
			continue
		}
		rp, err := readCopy(filepath.Join(dir, RetainedDir, e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, rp)
	}
	ents, err = os.ReadDir(filepath.Join(dir, SavepointDir))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	for _, e := range ents {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".savepoint") {
			continue
		}
		rp, err := readSavepointPoint(filepath.Join(dir, SavepointDir, e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, rp)
	}
	slices.SortStableFunc(out, func(a, b RestorePoint) int {
		if a.ID != b.ID {
			if a.ID > b.ID {
				return -1
			}
			return 1
		}
		return strings.Compare(b.Kind, a.Kind) // savepoint before retained
	})
	return out, nil
}

// WriteFile writes the frozen checkpoint to path atomically: to path.tmp,
// synced, renamed, the directory synced (path is never partial). It refuses
// an existing path and returns the file's size.
func (sv *Savepoint) WriteFile(ctx context.Context, path string) (int64, error) {
	if _, err := os.Stat(path); err == nil {
		return 0, fmt.Errorf("checkpoint: savepoint %s exists", path)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return 0, fmt.Errorf("checkpoint: savepoint: %w", err)
	}
	tmp := path + ".tmp"
	fh, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return 0, fmt.Errorf("checkpoint: savepoint: %w", err)
	}
	werr := sv.WriteTo(ctx, fh)
	if werr == nil {
		werr = fh.Sync()
	}
	if err := errors.Join(werr, fh.Close()); err != nil {
		_ = os.Remove(tmp) // partial: never leave it looking usable
		return 0, fmt.Errorf("checkpoint: write savepoint: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return 0, fmt.Errorf("checkpoint: savepoint: %w", err)
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return 0, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

func writeFileSync(path string, b []byte) error {
	fh, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = fh.Write(b)
	if err == nil {
		err = fh.Sync()
	}
	return errors.Join(err, fh.Close())
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("checkpoint: sync %s: %w", dir, err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("checkpoint: sync %s: %w", dir, err)
	}
	return nil
}

// RestoreResult describes what RestoreFrom did.
type RestoreResult struct {
	// Applied is false when the store had already applied this spec (a
	// restarted job resumes from its latest checkpoint) or the spec names
	// the latest checkpoint itself.
	Applied bool
	// From is the restored point; Latest the store's latest checkpoint
	// afterwards (the restored point under a new id when the store held
	// checkpoints before).
	From   RestorePoint
	Latest Metadata
	// Replaced is the latest checkpoint the restore replaced (zero when the
	// store was empty): output that sinks committed after From and up to
	// Replaced is what a restore to an older point would write again.
	Replaced Metadata
}

// RestoreFrom makes a restore point the latest checkpoint of the store in
// dir (created if needed). spec is a checkpoint id (a retained copy, else a
// savepoint in dir's savepoints directory) or the path of a savepoint file.
// The store's offsets, pending sink commits and state are replaced by the
// point's; its metadata history is kept, and the restored checkpoint gets
// the next id (the point's own id in an empty store), so that ids keep
// increasing. The point's fingerprint must match opts.Fingerprint (when
// set). The restore is crash-safe (a marker makes Open refuse a half-done
// one, and RestoreFrom redoes it) and applied once: the store records spec,
// and a later call with the same spec does nothing (Applied false), so a
// job restarted with its restore option resumes from its latest checkpoint.
// The job must be stopped (the store's lock).
func RestoreFrom(ctx context.Context, dir, spec string, opts Options) (res RestoreResult, err error) {
	if spec == "" {
		return res, fmt.Errorf("%w: empty restore point", ErrInvalid)
	}
	s, err := open(dir, opts)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, s.Close()) }()
	restoring := s.checkRestoring() != nil
	if applied, ok, err := s.get(keyApplied); err != nil {
		return res, err
	} else if ok && string(applied) == spec && !restoring {
		res.Latest, _ = s.Latest()
		return res, nil
	}
	res.Replaced, _ = s.Latest()
	from, err := resolveRestorePoint(dir, spec, res.Replaced)
	if err != nil {
		return res, err
	}
	res.From = from
	if from.Kind == KindLatest {
		res.Latest = res.Replaced
		return res, s.setApplied(spec)
	}
	fp := opts.Fingerprint
	if fp.IsZero() {
		fp = from.Metadata.Fingerprint
	} else if err := diffFingerprints(from.Metadata.Fingerprint, fp).err(fmt.Sprintf("%s %d", from.Kind, from.ID), nil); err != nil {
		return res, err
	}
	r, closeSrc, err := openPointStream(ctx, from)
	if err != nil {
		return res, err
	}
	sr, m, err := readSavepointHeader(bufio.NewReaderSize(r, 256<<10))
	if err == nil && m.ID != from.ID {
		err = corruptf("%s names checkpoint %d, expected %d", from.Path, m.ID, from.ID)
	}
	if err == nil {
		maxID, merr := s.maxMetaID()
		if merr != nil {
			err = merr
		} else {
			id := from.ID
			if maxID > 0 {
				id = max(maxID, from.ID) + 1
			}
			m.RestoredFrom, m.Restore = from.ID, spec
			m.Prev = res.Replaced.ID
			m.Time = time.Now().UTC()
			res.Latest, err = s.load(ctx, sr, m, fp, nil, id, spec, false)
		}
	}
	if cerr := closeSrc(); err == nil {
		err = cerr
	}
	if err != nil {
		return res, err
	}
	res.Applied = true
	return res, nil
}

func (s *Store) setApplied(spec string) error {
	if err := s.db.Set(keyApplied, []byte(spec), pebble.Sync); err != nil {
		return fmt.Errorf("checkpoint: restore: %w", err)
	}
	return nil
}

// maxMetaID returns the highest checkpoint id with metadata (0: none).
func (s *Store) maxMetaID() (uint64, error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{famMeta}, UpperBound: []byte{famMeta + 1}})
	if err != nil {
		return 0, fmt.Errorf("checkpoint: read: %w", err)
	}
	var id uint64
	if it.Last() && len(it.Key()) == 9 {
		id = binary.BigEndian.Uint64(it.Key()[1:])
	}
	if err := it.Close(); err != nil {
		return 0, fmt.Errorf("checkpoint: read: %w", err)
	}
	return id, nil
}

// resolveRestorePoint finds what spec names.
func resolveRestorePoint(dir, spec string, latest Metadata) (RestorePoint, error) {
	id, perr := strconv.ParseUint(spec, 10, 64)
	if perr != nil {
		return readSavepointPoint(spec)
	}
	points, err := ListRestorePoints(dir)
	if err != nil {
		return RestorePoint{}, err
	}
	// A retained copy first (no decoding of a stream), then a savepoint.
	for _, kind := range []string{KindRetained, KindSavepoint} {
		for _, p := range points {
			if p.ID == id && p.Kind == kind {
				return p, nil
			}
		}
	}
	if latest.ID == id && id != 0 {
		return RestorePoint{ID: id, Time: latest.Time, Kind: KindLatest, Path: dir, Metadata: latest}, nil
	}
	ids := make([]string, 0, len(points)+1)
	if latest.ID != 0 {
		ids = append(ids, strconv.FormatUint(latest.ID, 10)+" (latest)")
	}
	for _, p := range points {
		ids = append(ids, strconv.FormatUint(p.ID, 10)+" ("+p.Kind+")")
	}
	if len(ids) == 0 {
		ids = append(ids, "none")
	}
	return RestorePoint{}, fmt.Errorf("%w: checkpoint %d of %s is neither retained nor a savepoint there (restorable: %s)",
		ErrInvalid, id, dir, strings.Join(ids, ", "))
}

// openPointStream returns the savepoint stream of a restore point: the file
// of a savepoint, or a retained copy opened read-only and streamed through
// a pipe by a goroutine that closeSrc joins.
func openPointStream(ctx context.Context, p RestorePoint) (r io.Reader, closeSrc func() error, err error) {
	if p.Kind == KindSavepoint {
		fh, err := os.Open(p.Path)
		if err != nil {
			return nil, nil, fmt.Errorf("checkpoint: savepoint: %w", err)
		}
		return fh, fh.Close, nil
	}
	src, err := open(p.Path, Options{readOnly: true})
	if err != nil {
		return nil, nil, fmt.Errorf("checkpoint: retained copy %s: %w", p.Path, err)
	}
	sv, err := src.NewSavepoint()
	if err != nil {
		_ = src.Close()
		return nil, nil, fmt.Errorf("checkpoint: retained copy %s: %w", p.Path, err)
	}
	pr, pw := io.Pipe()
	var wg sync.WaitGroup
	var werr error
	wg.Go(func() {
		werr = sv.WriteTo(ctx, pw)
		_ = pw.CloseWithError(werr) // the reader sees werr, or EOF
	})
	return pr, func() error {
		_ = pr.Close() // unblocks the writer if the reader stopped early
		wg.Wait()
		err := errors.Join(sv.Close(), src.Close())
		if werr != nil && !errors.Is(werr, io.ErrClosedPipe) {
			err = errors.Join(werr, err)
		}
		return err
	}, nil
}
