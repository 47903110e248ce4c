package sink

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
)

// Stdout writes one line per record to an io.Writer (os.Stdout by default),
// formatted with fmt's %v or a custom format function, buffered and flushed
// at each barrier. It is at-least-once: after a crash, records since the last
// checkpoint are printed again.
type Stdout[T any] struct {
	w      *bufio.Writer
	format func(T) string
	buf    []byte
}

// NewStdout returns a Stdout sink writing to w (os.Stdout when nil), each
// record rendered by format (fmt.Sprint when nil).
func NewStdout[T any](w io.Writer, format func(T) string) *Stdout[T] {
	if w == nil {
		w = os.Stdout
	}
	return &Stdout[T]{w: bufio.NewWriter(w), format: format}
}

// Write implements Sink.
func (s *Stdout[T]) Write(_ context.Context, v T) error {
	s.buf = s.buf[:0]
	if s.format != nil {
		s.buf = append(s.buf, s.format(v)...)
	} else {
		s.buf = fmt.Append(s.buf, v)
	}
	s.buf = append(s.buf, '\n')
	_, err := s.w.Write(s.buf)
	return err
}

// Flush implements Sink.
func (s *Stdout[T]) Flush(context.Context) error { return s.w.Flush() }

// Close implements Sink: it flushes.
func (s *Stdout[T]) Close() error { return s.w.Flush() }

// Func is a sink calling a function for each record. Flush calls the
// optional flush function. The runtime calls both from one goroutine.
type Func[T any] struct {
	write func(context.Context, T) error
	flush func(context.Context) error
}

// NewFunc returns a sink that calls write for each record and flush (when not
// nil) at each barrier.
func NewFunc[T any](write func(context.Context, T) error, flush func(context.Context) error) *Func[T] {
	return &Func[T]{write: write, flush: flush}
}

// Write implements Sink.
func (f *Func[T]) Write(ctx context.Context, v T) error { return f.write(ctx, v) }

// Flush implements Sink.
func (f *Func[T]) Flush(ctx context.Context) error {
	if f.flush == nil {
		return nil
	}
	return f.flush(ctx)
}

// Close implements Sink.
func (f *Func[T]) Close() error { return nil }
