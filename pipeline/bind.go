package pipeline

import (
	"fmt"
	"reflect"

	"github.com/runnel-dev/runnel/jobinfo"
)

// binderOf returns v as a jobinfo.Binder, or nil.
func binderOf(v any) jobinfo.Binder {
	b, _ := v.(jobinfo.Binder)
	return b
}

// bind calls Bind on every source and sink of the job that implements
// jobinfo.Binder (sources of FromSource, FromBytes and FromSourceDecoded,
// sinks of To and of DeadLetter policies), in the order they were added,
// with the job's name, the operator's UID and the checkpoint directory:
// before anything is restored or opened, so that a source or sink derives
// its groups and names before its first request. A pointer added under
// several UIDs is bound once, with the first. The first error fails Run.
func (j *Job) bind() error {
	bound := make(map[jobinfo.Binder]bool)
	for _, n := range j.nodes {
		b := n.binder
		if b == nil {
			continue
		}
		if reflect.TypeOf(b).Kind() == reflect.Pointer {
			if bound[b] {
				continue
			}
			bound[b] = true
		}
		info := jobinfo.Info{Job: j.name, UID: n.uid, StateDir: j.cfg.dir}
		if sc := j.scope; sc != nil {
			info.Scaleout = &jobinfo.Scaleout{Task: sc.task, OwnerEpoch: sc.owner, Chains: sc.chains}
		}
		if err := b.Bind(info); err != nil {
			return fmt.Errorf("pipeline: %s %q: bind: %w", n.kind, n.uid, err)
		}
	}
	return nil
}
