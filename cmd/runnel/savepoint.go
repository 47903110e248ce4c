package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/runnel-dev/runnel/checkpoint"
	"github.com/runnel-dev/runnel/runtime"
)

func newSavepointCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "savepoint",
		Short: "Take a savepoint of a running job, write a stopped job's checkpoint to a file, or restore one",
		Long: `Savepoints are portable, checksummed files of a completed checkpoint: source
offsets, keyed state and pending sink commits. Take one of a running job (and
stop it) before upgrading or moving it, keep it as a backup, restore the job
from it (pipeline.RestoreFrom), or start a new checkpoint directory from it.

Examples:
  runnel savepoint create --job 127.0.0.1:8080 --stop
  runnel savepoint create ./ckpt --out orders-2024-05-01.savepoint
  runnel savepoint restore orders-2024-05-01.savepoint ./ckpt-new
  runnel savepoint restore old.savepoint ./ckpt-new --drop-operator old-counter`,
	}
	cmd.AddCommand(newSavepointCreateCmd(), newSavepointRestoreCmd())
	return cmd
}

func newSavepointCreateCmd() *cobra.Command {
	var out, job string
	var stop bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "create (--job ADDR [--stop] | DIR --out FILE)",
		Short: "Take a savepoint of a running job, or write a stopped job's latest checkpoint to FILE",
		Long: `With --job, asks the running job whose status endpoint is at ADDR (its
pipeline.StatusAddress, host:port) for a savepoint: the job takes a checkpoint
and writes it, self-contained (source offsets, keyed state, the sinks'
pre-committed transactions), into savepoints/ of its checkpoint directory,
and prints its id and file once that file is synced. With --stop the job
stops after that checkpoint: its sinks commit the savepoint's transactions
and the job exits (its Run returns nil). Restore with the job's restore option
(pipeline.RestoreFrom, examples/etl's -restore) by id or by file.

Without --job, writes the latest completed checkpoint of the stopped job's
checkpoint directory DIR to FILE (written to FILE.tmp, synced, then renamed:
FILE is never partial). An existing FILE is not overwritten.

Examples:
  runnel savepoint create --job 127.0.0.1:8080
  runnel savepoint create --job 127.0.0.1:8080 --stop
  runnel savepoint create ./ckpt --out orders.savepoint`,
		Args: func(cmd *cobra.Command, args []string) error {
			if job != "" {
				if len(args) != 0 {
					return fmt.Errorf("--job takes no DIR (got %d arguments)", len(args))
				}
				return nil
			}
			if stop {
				return errors.New("--stop needs --job ADDR (a stopped job has nothing to stop)")
			}
			return exactArgs(1, "DIR")(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			if job != "" {
				return savepointOfJob(cmd, job, stop, timeout)
			}
			if out == "" {
				return fmt.Errorf("--out FILE is required (see `%s --help`)", cmd.CommandPath())
			}
			if _, err := os.Stat(out); err == nil {
				return fmt.Errorf("--out %s exists; remove it or choose another name", out)
			}
			s, md, err := openLatest(args[0])
			if err != nil {
				return err
			}
			defer func() { err = errors.Join(err, s.Close()) }()
			sv, err := s.NewSavepoint()
			if err != nil {
				return err
			}
			n, err := sv.WriteFile(cmd.Context(), out)
			if err := errors.Join(err, sv.Close()); err != nil {
				return fmt.Errorf("write savepoint: %w", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote savepoint of checkpoint %d to %s (%d bytes)\n", md.ID, out, n)
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "savepoint file to write (with DIR)")
	cmd.Flags().StringVar(&job, "job", "", "status endpoint (host:port) of the running job")
	cmd.Flags().BoolVar(&stop, "stop", false, "stop the job after the savepoint (with --job)")
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "how long to wait for the savepoint (with --job)")
	return cmd
}

// savepointOfJob asks a running job's status endpoint for a savepoint.
func savepointOfJob(cmd *cobra.Command, addr string, stop bool, timeout time.Duration) error {
	if strings.Contains(addr, "/") {
		return fmt.Errorf("--job %q: want the status endpoint's host:port", addr)
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("--job %q: want host:port: %w", addr, err)
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
	defer cancel()
	url := "http://" + addr + "/savepoint"
	if stop {
		url += "?stop=true"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("savepoint of the job at %s: %w (is the job running with its status endpoint there?)", addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("savepoint of the job at %s: %w", addr, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(body, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(body))
		}
		return fmt.Errorf("savepoint of the job at %s: %s: %s", addr, resp.Status, e.Error)
	}
	var res runtime.SavepointResult
	if err := json.Unmarshal(body, &res); err != nil {
		return fmt.Errorf("savepoint of the job at %s: bad answer %q: %w", addr, body, err)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "savepoint of checkpoint %d written to %s (%d bytes)\n", res.ID, res.Path, res.Bytes)
	if res.Stop {
		fmt.Fprintln(cmd.OutOrStdout(), "the job stops: its sinks commit this checkpoint's transactions, then it exits")
	}
	return nil
}

func newSavepointRestoreCmd() *cobra.Command {
	var drop []string
	cmd := &cobra.Command{
		Use:   "restore FILE DIR",
		Short: "Load a savepoint FILE into a new checkpoint directory DIR",
		Long: `Loads the savepoint FILE into the checkpoint directory DIR (created if
needed), which must not hold a completed checkpoint yet. A job started on DIR
then resumes from the savepoint: same offsets, state and pending sink commits.
The restored checkpoint keeps the savepoint's id and job fingerprint.

--drop-operator leaves the state of an operator out (for a job that no longer
has it, or changed its state incompatibly); repeat it for several.

Examples:
  runnel savepoint restore orders.savepoint ./ckpt-new
  runnel savepoint restore orders.savepoint ./ckpt-new --drop-operator dedup`,
		Args: exactArgs(2, "FILE DIR"),
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			fh, err := os.Open(args[0])
			if err != nil {
				return fmt.Errorf("savepoint: %w", err)
			}
			defer fh.Close()
			dir := args[1]
			if err := os.MkdirAll(filepath.Clean(dir), 0o755); err != nil {
				return err
			}
			if err := checkpoint.RestoreSavepoint(cmd.Context(), dir, fh, checkpoint.Options{}, drop...); err != nil {
				if errors.Is(err, checkpoint.ErrNotEmpty) {
					return fmt.Errorf("%s already holds checkpoints: restore into a new directory: %w", dir, err)
				}
				return fmt.Errorf("restore %s into %s: %w", args[0], dir, err)
			}
			s, md, err := openLatest(dir)
			if err != nil {
				return err
			}
			defer func() { err = errors.Join(err, s.Close()) }()
			fmt.Fprintf(cmd.OutOrStdout(), "restored checkpoint %d from %s into %s\n", md.ID, args[0], dir)
			return nil
		},
	}
	cmd.Flags().StringArrayVar(&drop, "drop-operator", nil, "operator UID whose state is left out (repeatable)")
	return cmd
}
