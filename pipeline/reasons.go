package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/state"
)

// Why records are rejected: the reason classes of dead letters
// (sink.DeadLetter.Reason starts with one, then ": " and the error), of the
// status page's recent dead letters and of runtime.HookDeadLetter.
const (
	// ReasonDecode: a source record could not be decoded (FromBytes'
	// codec, FromSourceDecoded's function).
	ReasonDecode = "decode"
	// ReasonValidate: a decoded record failed validation (go-playground
	// validator struct tags, see Validate).
	ReasonValidate = "validate"
	// ReasonProcess: a user function failed on the record after its
	// retries.
	ReasonProcess = "process"
	// ReasonPanic: a user function panicked on the record.
	ReasonPanic = "panic"
	// ReasonLate: the record arrived behind the operator's watermark,
	// after everything it belonged to expired (KeyedContext.LateRecord; a
	// window operator without a LateRecords side output).
	ReasonLate = "late"
)

// recordError is a rejection with its reason class, for the source edge's
// decode and validation failures and for late records.
type recordError struct {
	reason string
	err    error
}

func (e *recordError) Error() string { return e.err.Error() }
func (e *recordError) Unwrap() error { return e.err }

// reasonOf classifies a rejected record's error.
func reasonOf(err error, fromSource bool) string {
	var re *recordError
	switch {
	case errors.As(err, &re):
		return re.reason
	case errors.Is(err, ErrPanic):
		return ReasonPanic
	case fromSource:
		return ReasonDecode
	}
	return ReasonProcess
}

// deadLetterer returns the function that sends a record rejected by
// operator (of node n) to policy p's dead-letter sink: it runs the hooks,
// shows it on the status page and emits the sink.DeadLetter, whose Reason
// is the reason class, ": " and the error. Counting is the caller's.
func (b *chainBuilder) deadLetterer(n *node, operator string, p Policy) func(ctx context.Context, err error, v any, ts int64) error {
	dn := b.r.job.dlqNode(p)
	in, err := b.input(dn)
	if err != nil {
		return func(context.Context, error, any, int64) error { return err }
	}
	dlq := in.(emitFn[sink.DeadLetter])
	job := b.r.job
	hooks, fromSource := b.r.hooks, n.kind == kindSource
	return func(ctx context.Context, err error, v any, ts int64) error {
		reason := reasonOf(err, fromSource)
		hooks.onDeadLetter(operator, reason, "dead-letter")
		recordDeadLetter(b.r.engine, operator, "dead-letter", reason, err) // statusgraph.go
		d := sink.DeadLetter{
			Source:   b.meta.source,
			Operator: operator,
			Split:    b.meta.split,
			Offset:   append([]byte(nil), b.meta.offset...),
			Raw:      append([]byte(nil), b.meta.raw...),
			Reason:   reason + ": " + err.Error(),
			Time:     job.cfg.clock(),
		}
		if len(d.Raw) == 0 {
			d.Raw = nil
			d.Value = fmt.Sprint(v)
		}
		if len(d.Offset) == 0 {
			d.Offset = nil
		}
		return dlq(ctx, d, ts)
	}
}

// jsonCodec is JSON's codec: state.JSONCodec's encoding and ID, with a
// decode error that says what could not be decoded into what (a source
// record's dead letter reads "decode: cannot decode JSON into main.Click:
// …"); it still matches state.ErrDecode.
type jsonCodec[T any] struct{}

func (jsonCodec[T]) Append(dst []byte, v T) ([]byte, error) {
	return state.JSONCodec[T]().Append(dst, v)
}

func (jsonCodec[T]) Decode(b []byte) (T, error) {
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		return v, &jsonDecodeError{typ: fmt.Sprintf("%T", v), err: err}
	}
	return v, nil
}

func (jsonCodec[T]) ID() string { return state.JSONCodec[T]().ID() }

type jsonDecodeError struct {
	typ string
	err error
}

func (e *jsonDecodeError) Error() string {
	return "cannot decode JSON into " + e.typ + ": " + e.err.Error()
}

func (e *jsonDecodeError) Unwrap() []error { return []error{state.ErrDecode, e.err} }
