package etl

import (
	"io"
	"strings"
	"testing"
)

// TestParseFlagsWorker checks that the worker flags reach Config and that
// contradictory or stray arguments are refused rather than ignored.
func TestParseFlagsWorker(t *testing.T) {
	f, err := ParseFlags("etl", []string{"-status", "127.0.0.1:0", "-ranges", "6", "-standbys", "1", "-partitioned", "-group", "g1", "-state", "s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c := f.Config
	if c.StatusAddr != "127.0.0.1:0" || c.Ranges != 6 || c.Standbys != 1 || !c.Partitioned || c.SingleProcess || c.Group != "g1" || c.StateDir != "s" {
		t.Errorf("config %+v", c)
	}
	if f, err := ParseFlags("etl", []string{"-single-process"}, io.Discard); err != nil || !f.Config.SingleProcess || f.Config.StateDir != "etl-state" {
		t.Errorf("-single-process: %+v, %v", f, err)
	}
	if f, err := ParseFlags("etl", []string{"-single-process", "-status", ":0", "-restore", "12", "-keep-checkpoints", "3"}, io.Discard); err != nil ||
		f.Config.Restore != "12" || f.Config.KeepCheckpoints != 3 || f.Config.StatusAddr != ":0" {
		t.Errorf("-single-process -status -restore -keep-checkpoints: %+v, %v", f, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-single-process", "-ranges", "4"}, "do not apply with -single-process"},
		{[]string{"-restore", "7"}, "-restore and -keep-checkpoints need -single-process"},
		{[]string{"-keep-checkpoints", "2"}, "-restore and -keep-checkpoints need -single-process"},
		{[]string{"-single-process", "-keep-checkpoints", "-1"}, "-keep-checkpoints -1"},
		{[]string{"-single-process", "-partitioned"}, "do not apply with -single-process"},
		{[]string{"-ranges", "-1"}, "-ranges -1"},
		{[]string{"-ranges", "129"}, "-ranges 129"},
		{[]string{"-standbys", "-2"}, "-standbys -2"},
		{[]string{"-state", "s", "extra"}, `unexpected argument "extra"`},
	} {
		if _, err := ParseFlags("etl", tc.args, io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error mentioning %q", tc.args, err, tc.want)
		}
	}
}
