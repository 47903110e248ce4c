package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/runnel-dev/runnel/checkpoint"
)

func newSavepointCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "savepoint",
		Short: "Write a job's latest checkpoint to a portable file, or restore one",
		Long: `Savepoints are portable, checksummed files of a job's latest completed
checkpoint: source offsets, keyed state and pending sink commits. Take one
before upgrading or moving a job, keep it as a backup, or start a new
checkpoint directory from it.

Examples:
  runnel savepoint create ./ckpt --out orders-2024-05-01.savepoint
  runnel savepoint restore orders-2024-05-01.savepoint ./ckpt-new
  runnel savepoint restore old.savepoint ./ckpt-new --drop-operator old-counter`,
	}
	cmd.AddCommand(newSavepointCreateCmd(), newSavepointRestoreCmd())
	return cmd
}

func newSavepointCreateCmd() *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "create DIR --out FILE",
		Short: "Write the latest checkpoint of DIR to FILE",
		Long: `Writes the latest completed checkpoint of the checkpoint directory DIR to
FILE (written to FILE.tmp, synced, then renamed: FILE is never partial). The
job must be stopped. An existing FILE is not overwritten.

Example:
  runnel savepoint create ./ckpt --out orders.savepoint`,
		Args: exactArgs(1, "DIR"),
		RunE: func(cmd *cobra.Command, args []string) (err error) {
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
			tmp := out + ".tmp"
			fh, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
			if err != nil {
				return err
			}
			werr := s.WriteSavepoint(cmd.Context(), fh)
			if werr == nil {
				werr = fh.Sync()
			}
			if err := errors.Join(werr, fh.Close()); err != nil {
				_ = os.Remove(tmp) // partial: never leave it looking usable
				return fmt.Errorf("write savepoint: %w", err)
			}
			if err := os.Rename(tmp, out); err != nil {
				return err
			}
			st, err := os.Stat(out)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote savepoint of checkpoint %d to %s (%d bytes)\n", md.ID, out, st.Size())
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "savepoint file to write (required)")
	return cmd
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
