package postgres

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/runnel-dev/runnel/internal/backoff"
	"github.com/runnel-dev/runnel/internal/failpoint"
)

// txnVersion is the first byte of a pre-commit description.
const txnVersion = 1

// encodeTxn is the pre-commit description stored in the checkpoint:
// version, checkpoint id (uvarint), gid length (uvarint), gid ("" when the
// epoch wrote nothing).
func encodeTxn(id uint64, gid string) []byte {
	b := make([]byte, 0, 1+2*binary.MaxVarintLen64+len(gid))
	b = append(b, txnVersion)
	b = binary.AppendUvarint(b, id)
	b = binary.AppendUvarint(b, uint64(len(gid)))
	return append(b, gid...)
}

// decodeTxn parses encodeTxn's output. It never panics; any other input
// yields ErrBadTransaction.
func decodeTxn(b []byte) (id uint64, gid string, err error) {
	if len(b) == 0 || b[0] != txnVersion {
		return 0, "", fmt.Errorf("%w: unknown version", ErrBadTransaction)
	}
	b = b[1:]
	id, n := binary.Uvarint(b)
	if n <= 0 {
		return 0, "", fmt.Errorf("%w: bad checkpoint id", ErrBadTransaction)
	}
	b = b[n:]
	l, n := binary.Uvarint(b)
	if n <= 0 || l > maxGIDLen || l != uint64(len(b)-n) {
		return 0, "", fmt.Errorf("%w: bad id length", ErrBadTransaction)
	}
	return id, string(b[n:]), nil
}

// escapeGID %-escapes every byte outside [A-Za-z0-9._-], so that ':'
// separates the fields of a gid unambiguously.
func escapeGID(s string) string {
	var sb strings.Builder
	for i := range len(s) {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' {
			sb.WriteByte(c)
			continue
		}
		fmt.Fprintf(&sb, "%%%02X", c)
	}
	return sb.String()
}

// GID returns the prepared transaction id the ExactlyOnce sink uses for
// job, sinkUID, subtask and checkpoint id.
func GID(job, sinkUID string, subtask int, checkpointID uint64) string {
	return GIDPrefix(job, sinkUID) + strconv.Itoa(subtask) + ":" + strconv.FormatUint(checkpointID, 10)
}

// GIDPrefix returns the prefix shared by the prepared transaction ids of
// every subtask of the sink sinkUID of job (what Recover searches
// pg_prepared_xacts for).
func GIDPrefix(job, sinkUID string) string {
	return "runnel:" + escapeGID(job) + ":" + escapeGID(sinkUID) + ":"
}

// quoteLiteral quotes s as an SQL string literal (PREPARE TRANSACTION and
// COMMIT PREPARED take no parameters).
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func (s *Sink[T]) gid(id uint64) string { return s.prefix + strconv.FormatUint(id, 10) }

// ensureRecovered runs recovery with no pending transactions when the sink
// is used without Recover (the runtime always calls it first).
func (s *Sink[T]) ensureRecovered(ctx context.Context) error {
	if s.recovered {
		return nil
	}
	return s.Recover(ctx, nil)
}

// sendEpoch sends the buffered rows into the epoch transaction, beginning
// it (and replaying the epoch's earlier rows after a failure) as needed.
func (s *Sink[T]) sendEpoch(ctx context.Context) error {
	if err := s.ensureRecovered(ctx); err != nil {
		return err
	}
	err := s.do(ctx, "write", func(ctx context.Context) error {
		c, err := s.openEpoch(ctx)
		if err != nil {
			return err
		}
		if err := s.writeRows(ctx, c, s.buf); err != nil {
			s.broken = true
			return s.connErr(c, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	n := len(s.buf)
	s.stats.rows.Add(int64(n))
	s.epochN += n
	if s.overflow || s.epochN > s.cfg.maxEpochRows {
		s.overflow = true
		clear(s.epoch)
		s.epoch = s.epoch[:0]
	} else {
		s.epoch = append(s.epoch, s.buf...)
	}
	clear(s.buf)
	s.buf = s.buf[:0]
	s.slab = nil // the epoch keeps referencing it
	return nil
}

// openEpoch returns the data connection inside the epoch transaction:
// after a failure it rolls back what is left and replays the epoch's rows.
func (s *Sink[T]) openEpoch(ctx context.Context) (*pgx.Conn, error) {
	if s.broken && s.overflow {
		return nil, fmt.Errorf("%w (%d rows, WithMaxEpochRows %d)", ErrEpochTooLarge, s.epochN, s.cfg.maxEpochRows)
	}
	c, err := s.dataConn(ctx)
	if err != nil {
		return nil, err
	}
	if s.broken && s.inTxn {
		if _, err := c.Exec(ctx, "ROLLBACK"); err != nil {
			return nil, s.connErr(c, err)
		}
		s.inTxn = false
	}
	if s.inTxn {
		return c, nil
	}
	if _, err := c.Exec(ctx, "BEGIN"); err != nil {
		return nil, s.connErr(c, err)
	}
	s.inTxn = true
	if s.broken {
		for rows := s.epoch; len(rows) > 0; {
			n := min(len(rows), s.cfg.batch)
			if err := s.writeRows(ctx, c, rows[:n]); err != nil {
				return nil, s.connErr(c, err)
			}
			rows = rows[n:]
		}
		s.stats.replayed.Add(int64(len(s.epoch)))
		s.broken = false
	}
	return c, nil
}

// PreCommit implements sink.TwoPhaseCommit. In ExactlyOnce mode it sends
// the buffered rows, writes the commit marker and prepares the epoch's
// transaction under the gid of checkpointID, and returns the description the
// runtime keeps in the checkpoint; an epoch without rows prepares nothing.
// In the other modes it flushes and returns an empty description (Commit
// and Recover then do nothing).
func (s *Sink[T]) PreCommit(ctx context.Context, checkpointID uint64) ([]byte, error) {
	if s.closed {
		return nil, ErrClosed
	}
	if s.cfg.mode != ExactlyOnce {
		// The runtime drives every Sink through this interface: without
		// prepared transactions the barrier is a Flush.
		if err := s.Flush(ctx); err != nil {
			return nil, err
		}
		return encodeTxn(checkpointID, ""), nil
	}
	if len(s.buf) > 0 {
		if err := s.sendEpoch(ctx); err != nil {
			return nil, err
		}
	}
	if err := s.ensureRecovered(ctx); err != nil {
		return nil, err
	}
	if !s.inTxn && !s.broken {
		return encodeTxn(checkpointID, ""), nil
	}
	gid := s.gid(checkpointID)
	insert := "INSERT INTO " + s.marker + " (gid, job, sink, subtask, checkpoint) VALUES ($1, $2, $3, $4, $5)"
	if failpoint.Enabled && s.cfg.faults.CommitEarly {
		// A run that committed early may have committed this gid already.
		insert += " ON CONFLICT (gid) DO NOTHING"
	}
	err := s.do(ctx, "prepare "+gid, func(ctx context.Context) error {
		c, err := s.openEpoch(ctx)
		if err != nil {
			return err
		}
		if _, err := c.Exec(ctx, insert, gid, s.cfg.job, s.cfg.uid, s.cfg.subtask, int64(checkpointID)); err != nil {
			s.broken = true
			return s.connErr(c, err)
		}
		_, err = c.Exec(ctx, "PREPARE TRANSACTION "+quoteLiteral(gid))
		if err == nil {
			return nil
		}
		s.broken = true
		if !c.IsClosed() {
			return err // the server refused: it rolled the transaction back
		}
		// The connection died: the transaction may or may not be prepared.
		ok, qerr := s.isPrepared(ctx, gid)
		if qerr != nil {
			return qerr
		}
		if ok {
			return nil
		}
		return &connLostError{err: err}
	})
	if err != nil {
		return nil, err
	}
	s.inTxn, s.broken, s.overflow = false, false, false
	clear(s.epoch)
	s.epoch, s.epochN = s.epoch[:0], 0
	s.highest = max(s.highest, checkpointID)
	s.stats.prepared.Add(1)
	if failpoint.Enabled && s.cfg.faults.CommitEarly {
		if err := s.do(ctx, "commit "+gid, func(ctx context.Context) error { return s.commitGID(ctx, gid) }); err != nil {
			return nil, err
		}
	}
	if err := failpointSleep(ctx, s.cfg.faults.PrepareDelay); err != nil {
		return nil, err
	}
	return encodeTxn(checkpointID, gid), nil
}

func (s *Sink[T]) isPrepared(ctx context.Context, gid string) (bool, error) {
	c, err := s.ctlConn(ctx)
	if err != nil {
		return false, err
	}
	var ok bool
	err = c.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_prepared_xacts WHERE gid = $1 AND database = current_database())", gid).Scan(&ok)
	return ok, s.connErr(c, err)
}

// committedMarker reports whether gid's commit marker exists.
func (s *Sink[T]) committedMarker(ctx context.Context, c *pgx.Conn, gid string) (bool, error) {
	var ok bool
	err := c.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+s.marker+" WHERE gid = $1)", gid).Scan(&ok)
	return ok, s.connErr(c, err)
}

// commitGID commits the prepared transaction gid; when it does not exist,
// the marker tells whether it was committed before (success) or rolled back
// (ErrTransactionLost).
func (s *Sink[T]) commitGID(ctx context.Context, gid string) error {
	c, err := s.ctlConn(ctx)
	if err != nil {
		return err
	}
	_, err = c.Exec(ctx, "COMMIT PREPARED "+quoteLiteral(gid))
	if err == nil {
		s.stats.committed.Add(1)
		return nil
	}
	if pgCode(err) != "42704" { // undefined_object: no such prepared transaction
		return s.connErr(c, err)
	}
	ok, err := s.committedMarker(ctx, c, gid)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w: %s is neither prepared nor committed", ErrTransactionLost, gid)
	}
	return nil
}

// rollbackGID rolls back the prepared transaction gid; when it does not
// exist, it succeeds unless the marker shows it committed.
func (s *Sink[T]) rollbackGID(ctx context.Context, gid string) error {
	c, err := s.ctlConn(ctx)
	if err != nil {
		return err
	}
	_, err = c.Exec(ctx, "ROLLBACK PREPARED "+quoteLiteral(gid))
	if err == nil {
		s.stats.rolledBack.Add(1)
		return nil
	}
	if pgCode(err) != "42704" {
		return s.connErr(c, err)
	}
	ok, err := s.committedMarker(ctx, c, gid)
	if err != nil {
		return err
	}
	if ok {
		return fmt.Errorf("postgres: abort %s: the transaction is already committed", gid)
	}
	return nil
}

// Commit implements sink.TwoPhaseCommit: COMMIT PREPARED, idempotent (see
// the package documentation). It also deletes the commit markers no
// checkpoint lists any more.
func (s *Sink[T]) Commit(ctx context.Context, txn []byte) error {
	if s.closed {
		return ErrClosed
	}
	id, gid, err := decodeTxn(txn)
	if err != nil {
		return err
	}
	if gid != "" {
		if err := failpointSleep(ctx, s.cfg.faults.CommitDelay); err != nil {
			return err
		}
		if err := s.do(ctx, "commit "+gid, func(ctx context.Context) error { return s.commitGID(ctx, gid) }); err != nil {
			return err
		}
		s.done = append(s.done, doneTxn{gid: gid, h: s.highest})
	}
	s.cleanup(ctx, id)
	return nil
}

// cleanup deletes the markers of transactions committed while the highest
// pre-committed checkpoint was below completed. Checkpoint completed was
// taken after their commit was reported to the runtime, so it no longer
// lists them and no restore will ask about them. A failure keeps them for
// the next attempt (it costs only rows in the commit table).
func (s *Sink[T]) cleanup(ctx context.Context, completed uint64) {
	var del []string
	kept := s.done[:0]
	for _, d := range s.done {
		if d.h < completed {
			del = append(del, d.gid)
		} else {
			kept = append(kept, d)
		}
	}
	if len(del) == 0 {
		return
	}
	err := s.do(ctx, "delete commit markers", func(ctx context.Context) error {
		c, err := s.ctlConn(ctx)
		if err != nil {
			return err
		}
		_, err = c.Exec(ctx, "DELETE FROM "+s.marker+" WHERE gid = ANY($1)", del)
		return s.connErr(c, err)
	})
	if err != nil {
		s.log.Warn("postgres sink: commit markers not deleted; retried after the next checkpoint", "n", len(del), "err", err)
		for _, g := range del {
			kept = append(kept, doneTxn{gid: g})
		}
	}
	s.done = kept
}

// Abort implements sink.TwoPhaseCommit: ROLLBACK PREPARED, idempotent. It
// fails if the transaction was already committed.
func (s *Sink[T]) Abort(ctx context.Context, txn []byte) error {
	if s.closed {
		return ErrClosed
	}
	_, gid, err := decodeTxn(txn)
	if err != nil || gid == "" {
		return err
	}
	return s.do(ctx, "abort "+gid, func(ctx context.Context) error { return s.rollbackGID(ctx, gid) })
}

// Recover implements sink.TwoPhaseCommit. It commits the prepared
// transactions pending lists (the latest checkpoint's), rolls back every
// other prepared transaction of this job and sink uid (all subtasks) in
// pg_prepared_xacts, and deletes the commit markers of this job and sink
// that pending does not list. The runtime calls it once at start, before
// any Write.
func (s *Sink[T]) Recover(ctx context.Context, pending [][]byte) error {
	if s.closed {
		return ErrClosed
	}
	if s.cfg.mode != ExactlyOnce {
		return nil
	}
	type txn struct {
		id  uint64
		gid string
	}
	var want []txn
	keep := map[string]bool{}
	for _, p := range pending {
		id, gid, err := decodeTxn(p)
		if err != nil {
			return err
		}
		s.highest = max(s.highest, id)
		if gid != "" && strings.HasPrefix(gid, s.uidPrefix) && !keep[gid] {
			keep[gid] = true
			want = append(want, txn{id, gid})
		}
	}
	slices.SortFunc(want, func(a, b txn) int { return compareU64(a.id, b.id) })
	for _, t := range want {
		if err := s.do(ctx, "recover: commit "+t.gid, func(ctx context.Context) error { return s.commitGID(ctx, t.gid) }); err != nil {
			return err
		}
		s.done = append(s.done, doneTxn{gid: t.gid, h: s.highest})
	}
	var orphans []string
	err := s.do(ctx, "recover: list prepared transactions", func(ctx context.Context) error {
		c, err := s.ctlConn(ctx)
		if err != nil {
			return err
		}
		rows, err := c.Query(ctx, "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND left(gid, length($1)) = $1 ORDER BY gid", s.uidPrefix)
		if err != nil {
			return s.connErr(c, err)
		}
		orphans, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return s.connErr(c, err)
	})
	if err != nil {
		return err
	}
	for _, gid := range orphans {
		if keep[gid] {
			continue
		}
		s.log.Info("postgres sink: rolling back a prepared transaction no completed checkpoint lists", "gid", gid)
		if err := s.do(ctx, "recover: roll back "+gid, func(ctx context.Context) error { return s.rollbackGID(ctx, gid) }); err != nil {
			return err
		}
	}
	err = s.do(ctx, "recover: delete commit markers", func(ctx context.Context) error {
		c, err := s.ctlConn(ctx)
		if err != nil {
			return err
		}
		kept := make([]string, 0, len(keep))
		for g := range keep {
			kept = append(kept, g)
		}
		_, err = c.Exec(ctx, "DELETE FROM "+s.marker+" WHERE job = $1 AND sink = $2 AND NOT (gid = ANY($3))", s.cfg.job, s.cfg.uid, kept)
		return s.connErr(c, err)
	})
	if err != nil {
		return err
	}
	s.recovered = true
	return nil
}

func compareU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// failpointSleep waits d (a failpoint delay) unless failpoints are compiled
// out.
func failpointSleep(ctx context.Context, d time.Duration) error {
	if !failpoint.Enabled || d <= 0 {
		return nil
	}
	return backoff.Sleep(ctx, d)
}
