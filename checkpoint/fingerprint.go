package checkpoint

import (
	"fmt"
	"slices"
	"strings"
)

// IsZero reports whether f is the zero Fingerprint (no check requested).
func (f Fingerprint) IsZero() bool { return f.MaxParallelism == 0 && len(f.Operators) == 0 }

// fingerprintDiff lists how running differs from stored. global holds
// differences no operator drop can fix (max parallelism); ops maps each
// differing operator UID to the reason.
type fingerprintDiff struct {
	global []string
	ops    map[string]string
}

func (d fingerprintDiff) empty() bool { return len(d.global) == 0 && len(d.ops) == 0 }

func diffFingerprints(stored, running Fingerprint) fingerprintDiff {
	d := fingerprintDiff{ops: map[string]string{}}
	if stored.MaxParallelism != running.MaxParallelism {
		d.global = append(d.global, fmt.Sprintf("max parallelism %d, job has %d", stored.MaxParallelism, running.MaxParallelism))
	}
	run := make(map[string]OperatorInfo, len(running.Operators))
	for _, o := range running.Operators {
		run[o.UID] = o
	}
	for _, o := range stored.Operators {
		r, ok := run[o.UID]
		switch {
		case !ok:
			d.ops[o.UID] = "not in the job"
		case r.Kind != o.Kind:
			d.ops[o.UID] = fmt.Sprintf("kind %q, job has %q", o.Kind, r.Kind)
		case r.Codecs != o.Codecs:
			d.ops[o.UID] = fmt.Sprintf("codecs %q, job has %q", o.Codecs, r.Codecs)
		}
	}
	return d
}

// err returns ErrFingerprintMismatch naming every difference not covered by
// drop, or nil.
func (d fingerprintDiff) err(what string, drop []string) error {
	var parts []string
	parts = append(parts, d.global...)
	uids := make([]string, 0, len(d.ops))
	for uid := range d.ops {
		if !slices.Contains(drop, uid) {
			uids = append(uids, uid)
		}
	}
	slices.Sort(uids)
	for _, uid := range uids {
		parts = append(parts, fmt.Sprintf("operator %q: %s", uid, d.ops[uid]))
	}
	if len(parts) == 0 {
		return nil
	}
	return fmt.Errorf("%w (%s): %s", ErrFingerprintMismatch, what, strings.Join(parts, "; "))
}
