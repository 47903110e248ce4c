package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/checkpoint"
)

// Savepoints, retained checkpoints and restores.
//
// A savepoint is a checkpoint taken on request (Engine.Savepoint, POST
// /savepoint on the status endpoint) whose content is then written to a
// self-contained savepoint file in the checkpoint directory
// (checkpoint.SavepointPath): source offsets, keyed state and the sinks'
// pre-committed transactions of that checkpoint. It is an ordinary
// checkpoint in every other way: its batch is the one synced commit, its
// sinks commit their transactions once it is durable, and its metadata says
// kind "savepoint". The file is written from a Pebble snapshot taken right
// after the commit (before any later checkpoint can commit), on a goroutine
// of the engine, so the job goes on meanwhile; the request is answered once
// the file is synced and renamed into place.
//
// With stop the savepoint is the job's stop checkpoint: sources stop at
// the barrier, the file is written before Run goes on, and Run returns only
// after every task closed, so after the sinks committed the savepoint's
// transactions (a sink whose commit fails makes Run fail). A job restored
// from that savepoint therefore finds its transactions committed and
// commits nothing twice.
//
// Retained copies (Config.KeepCheckpoints) are taken on the coordinator's
// goroutine right after a commit (checkpoint.Store.KeepCopy: a Pebble
// checkpoint of hard links), at most every RetainInterval.

var (
	// ErrNotRunning is returned by Savepoint when the job is not running
	// (not started yet, or ended before the savepoint completed).
	ErrNotRunning = errors.New("runtime: job not running")
	// ErrNoCheckpointDir is returned by Savepoint for a job without a
	// checkpoint directory (its checkpoints live in a temporary one).
	ErrNoCheckpointDir = errors.New("runtime: job has no checkpoint directory (pipeline.CheckpointDir): nowhere to keep a savepoint")
)

// SavepointResult describes a completed savepoint.
type SavepointResult struct {
	// ID is the checkpoint the savepoint holds.
	ID uint64 `json:"id"`
	// Path is the savepoint file (restore it with the job's restore
	// option, or by its ID).
	Path string `json:"path"`
	// Bytes is the file's size.
	Bytes int64 `json:"bytes"`
	// Stop is set when the job stops after it.
	Stop bool `json:"stop"`
}

type spReply struct {
	res SavepointResult
	err error
}

type spRequest struct {
	stop bool
	done chan spReply // cap 1
}

// savepoints is the engine's savepoint machinery.
type savepoints struct {
	req      chan *spRequest // to the coordinator
	ended    chan struct{}   // closed when the coordinator returned
	bg       sync.WaitGroup  // savepoint files being written
	lastCopy time.Time       // coordinator goroutine only
	restored checkpoint.RestoreResult
}

func (s *savepoints) init() {
	s.req = make(chan *spRequest)
	s.ended = make(chan struct{})
}

func replySavepoints(reqs []*spRequest, res SavepointResult, err error) {
	for _, r := range reqs {
		res := res
		res.Stop = r.stop
		r.done <- spReply{res: res, err: err}
	}
}

// Savepoint takes a savepoint of the running job: it triggers a checkpoint
// (right away, or after the one in flight), waits until it is durable and
// its savepoint file written, and returns the file. With stop, the job
// stops after it (see the comment at the top of savepoint.go). Requests
// that arrive together share one checkpoint.
func (e *Engine) Savepoint(ctx context.Context, stop bool) (SavepointResult, error) {
	r := &spRequest{stop: stop, done: make(chan spReply, 1)}
	select {
	case e.sp.req <- r:
	case <-e.sp.ended:
		return SavepointResult{}, ErrNotRunning
	case <-ctx.Done():
		return SavepointResult{}, ctx.Err()
	}
	select {
	case rep := <-r.done:
		return rep.res, rep.err
	case <-ctx.Done():
		return SavepointResult{}, fmt.Errorf("runtime: savepoint: %w (the savepoint may still complete)", ctx.Err())
	}
}

// afterCommit runs on the coordinator right after checkpoint cp committed
// (err nil) or failed: it starts writing the savepoint file of a savepoint
// and takes retained copies.
func (e *Engine) afterCommit(cp *inflight, err error) {
	if err != nil {
		replySavepoints(cp.sps, SavepointResult{}, fmt.Errorf("runtime: savepoint: %w", err))
		cp.sps = nil
		return
	}
	if len(cp.sps) > 0 {
		e.writeSavepoint(cp)
	}
	if e.cfg.KeepCheckpoints > 0 && e.cfg.Dir != "" && time.Since(e.sp.lastCopy) >= e.cfg.RetainInterval {
		start := time.Now()
		rp, err := e.store.KeepCopy()
		if err != nil {
			// Not fatal: the checkpoint itself is durable; the copy is an
			// extra restore point. Shown in the status's checkpoint list.
			e.log.Error("retaining a copy of the checkpoint failed", "job", e.cfg.Name, "checkpoint", cp.id, "err", err)
			e.mu.Lock()
			e.recordLocked(CheckpointStatus{ID: cp.id, Result: "retained copy failed: " + err.Error(), Time: e.cfg.Clock()})
			e.mu.Unlock()
			return
		}
		e.sp.lastCopy = start
		e.log.Debug("retained a copy of the checkpoint", "job", e.cfg.Name, "checkpoint", rp.ID, "took", time.Since(start))
	}
}

// writeSavepoint freezes the checkpoint cp just committed and writes its
// file: on this goroutine for a stop (Run must not return before), else on
// a goroutine of the engine.
func (e *Engine) writeSavepoint(cp *inflight) {
	sv, err := e.store.NewSavepoint()
	if err == nil && sv.Metadata().ID != cp.id {
		_ = sv.Close()
		err = fmt.Errorf("runtime: savepoint: store is at checkpoint %d, not %d", sv.Metadata().ID, cp.id)
	}
	if err != nil {
		replySavepoints(cp.sps, SavepointResult{}, err)
		cp.sps = nil
		return
	}
	reqs := cp.sps
	cp.sps = nil
	write := func() {
		path := checkpoint.SavepointPath(e.cfg.Dir, cp.id)
		start := time.Now()
		n, err := sv.WriteFile(context.Background(), path)
		err = errors.Join(err, sv.Close())
		if err != nil {
			e.log.Error("writing the savepoint failed", "job", e.cfg.Name, "checkpoint", cp.id, "err", err)
			replySavepoints(reqs, SavepointResult{}, err)
			return
		}
		e.log.Info("savepoint written", "job", e.cfg.Name, "checkpoint", cp.id, "path", path, "bytes", n, "took", time.Since(start))
		replySavepoints(reqs, SavepointResult{ID: cp.id, Path: path, Bytes: n}, nil)
	}
	if cp.stop {
		write()
		return
	}
	e.sp.bg.Go(write)
}

// restoreFrom applies Config.RestoreFrom to the store in dir (New).
func (e *Engine) restoreFrom(dir string) error {
	if e.cfg.Dir == "" {
		return fmt.Errorf("%w: a restore point needs the job's checkpoint directory", ErrInvalidConfig)
	}
	res, err := checkpoint.RestoreFrom(context.Background(), dir, e.cfg.RestoreFrom,
		checkpoint.Options{Logger: e.cfg.Logger, Fingerprint: e.cfg.Fingerprint})
	if err != nil {
		return fmt.Errorf("runtime: restore from %s: %w", e.cfg.RestoreFrom, err)
	}
	e.sp.restored = res
	if res.Applied {
		e.log.Info("restored from a retained checkpoint or savepoint", "job", e.cfg.Name, "from", res.From.ID,
			"kind", res.From.Kind, "path", res.From.Path, "as", res.Latest.ID, "replaced", res.Replaced.ID)
	} else {
		e.log.Info("restore point already applied: resuming from the latest checkpoint", "job", e.cfg.Name,
			"restore", e.cfg.RestoreFrom, "latest", res.Latest.ID)
	}
	return nil
}

// RestoredFrom reports the restore this run applied (Config.RestoreFrom):
// ok is false when it applied none (no RestoreFrom, or applied by an
// earlier run).
func (e *Engine) RestoredFrom() (checkpoint.RestoreResult, bool) {
	return e.sp.restored, e.sp.restored.Applied
}

// registerSavepointRoutes serves POST /savepoint[?stop=true]: the answer is
// the SavepointResult as JSON (200), or {"error": …} with 409 when the job
// is not running or has no checkpoint directory, 400 for a bad query, 500
// when the savepoint failed.
func (e *Engine) registerSavepointRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /savepoint", func(w http.ResponseWriter, r *http.Request) {
		stop := false
		if v := r.URL.Query().Get("stop"); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				writeError(w, http.StatusBadRequest, fmt.Errorf("stop=%q: want true or false", v))
				return
			}
			stop = b
		}
		ctx, cancel := context.WithTimeout(r.Context(), e.cfg.Timeout+time.Minute)
		defer cancel()
		res, err := e.Savepoint(ctx, stop)
		switch {
		case errors.Is(err, ErrNotRunning), errors.Is(err, ErrNoCheckpointDir):
			writeError(w, http.StatusConflict, err)
		case err != nil:
			writeError(w, http.StatusInternalServerError, err)
		default:
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(res) // the client may be gone
		}
	})
}

func writeError(w http.ResponseWriter, code int, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()}) // the client may be gone
}
