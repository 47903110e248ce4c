package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/runnel-dev/runnel/transport/client"
)

type produceFlags struct {
	cf        clusterFlags
	file      string
	body      []string
	tag       string
	keys      []string
	props     []string
	group     string
	inflight  int
	noBar     bool
	keyPrefix string
}

func newProduceCmd() *cobra.Command {
	var f produceFlags
	cmd := &cobra.Command{
		Use:   "produce TOPIC",
		Short: "Send messages to a topic: one per line of stdin or --file, or --body",
		Long: `Sends messages to TOPIC, which must exist (see ` + "`runnel topic create`" + `).
Each line of --file (or of stdin when neither --file nor --body is given) is
one message body (the trailing newline is not part of it); empty lines are
skipped, since RocketMQ refuses empty bodies. Lines may be up to 4 MiB long.
--body sends its value instead (repeat it for several messages).

Every message gets the --tag, the --keys and the --property values given.
Queues are chosen round robin. When stderr is a terminal, a progress bar on
it shows how many messages the broker confirmed (hide it with --no-progress);
a summary is printed on stdout at the end. The first failed send stops the
command.

Examples:
  runnel produce orders --body '{"id":1}' --tag created --keys 1
  seq 1 100000 | runnel produce numbers
  runnel produce orders --file orders.jsonl --property source=import --property batch=7`,
		Args: exactArgs(1, "TOPIC"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runProduce(cmd.Context(), cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr(), args[0], &f)
		},
	}
	f.cf.add(cmd)
	fl := cmd.Flags()
	fl.StringVar(&f.file, "file", "", "read message bodies from this file, one per line (default: stdin)")
	fl.StringArrayVar(&f.body, "body", nil, "send this body (repeatable); no stdin is read")
	fl.StringVar(&f.tag, "tag", "", "tag of every message (consumers filter on it)")
	fl.StringSliceVar(&f.keys, "keys", nil, "business keys of every message, comma-separated (no spaces)")
	fl.StringArrayVar(&f.props, "property", nil, "user property NAME=VALUE of every message (repeatable)")
	fl.StringVar(&f.group, "group", "runnel_cli_producer", "producer group")
	fl.IntVar(&f.inflight, "inflight", 256, "most sends awaiting the broker's answer at once")
	fl.BoolVar(&f.noBar, "no-progress", false, "do not draw the progress bar")
	return cmd
}

func runProduce(ctx context.Context, stdin io.Reader, out, errOut io.Writer, topic string, f *produceFlags) (err error) {
	if f.file != "" && len(f.body) > 0 {
		return errors.New("--file and --body exclude each other")
	}
	if f.inflight < 1 {
		return fmt.Errorf("--inflight %d: must be at least 1", f.inflight)
	}
	props := make(map[string]string, len(f.props))
	for _, p := range f.props {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return fmt.Errorf("--property %q: want NAME=VALUE", p)
		}
		props[k] = v
	}
	for _, k := range f.keys {
		if k == "" || strings.ContainsAny(k, " \t") {
			return fmt.Errorf("--keys %q: keys must be non-empty and contain no spaces", k)
		}
	}
	// Check one message up front so that bad tags or properties fail before
	// any I/O, with the client's own words.
	probe := &client.Message{Topic: topic, Body: []byte{'x'}, Tags: f.tag, Keys: f.keys, Properties: props}
	if err := client.ValidateMessage(probe, client.DefaultMaxBodySize); err != nil {
		return err
	}

	var in io.Reader = stdin
	total := int64(-1)
	switch {
	case len(f.body) > 0:
		in, total = nil, int64(len(f.body))
	case f.file != "":
		fh, err := os.Open(f.file)
		if err != nil {
			return err
		}
		defer fh.Close()
		if total, err = countLines(fh); err != nil {
			return fmt.Errorf("--file %s: %w", f.file, err)
		}
		if _, err := fh.Seek(0, io.SeekStart); err != nil {
			return err
		}
		in = fh
	}

	c, err := f.cf.client()
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, c.Close()) }()
	if _, err := f.cf.route(ctx, c, topic); err != nil {
		return err
	}
	p, err := client.NewProducer(c, f.group)
	if err != nil {
		return err
	}
	defer p.Close()

	barOut := errOut
	if f.noBar || !isTerminal(errOut) {
		barOut = io.Discard // a bar in a log file or pipe is noise
	}
	bar := progressbar.NewOptions64(total, progressbar.OptionSetWriter(barOut), progressbar.OptionSetDescription("producing"),
		progressbar.OptionShowCount(), progressbar.OptionShowIts(), progressbar.OptionSetItsString("msgs"),
		progressbar.OptionSetWidth(30), progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionOnCompletion(func() { fmt.Fprintln(barOut) }))

	s := &sender{p: p, sem: make(chan struct{}, f.inflight), bar: bar}
	start := time.Now()
	skipped := 0
	send := func(body []byte) error {
		m := &client.Message{Topic: topic, Body: body, Tags: f.tag, Keys: f.keys, Properties: props}
		return s.send(ctx, m)
	}
	if in == nil {
		for _, b := range f.body {
			if b == "" {
				err = errors.New("--body must not be empty: RocketMQ refuses empty bodies")
				break
			}
			if err = send([]byte(b)); err != nil {
				break
			}
		}
	} else {
		sc := bufio.NewScanner(in)
		sc.Buffer(make([]byte, 64<<10), client.DefaultMaxBodySize+1)
		for sc.Scan() {
			if len(sc.Bytes()) == 0 {
				skipped++
				continue
			}
			if err = send(append([]byte(nil), sc.Bytes()...)); err != nil {
				break
			}
		}
		if err == nil {
			if err = sc.Err(); errors.Is(err, bufio.ErrTooLong) {
				err = fmt.Errorf("a line is longer than the %d-byte message limit", client.DefaultMaxBodySize)
			}
		}
	}
	serr := s.wait()
	if ferr := bar.Finish(); err == nil {
		err = ferr
	}
	if total < 0 {
		fmt.Fprintln(barOut) // a spinner does not end its line
	}
	err = errors.Join(err, serr)
	n := s.done()
	took := time.Since(start)
	if err != nil {
		return fmt.Errorf("produce to %s stopped after %s: %w", topic, plural(n, "message"), err)
	}
	fmt.Fprintf(out, "produced %s to %s in %v (%.0f msgs/s)\n", plural(n, "message"), topic, took.Round(time.Millisecond), float64(n)/max(took.Seconds(), 1e-9))
	if skipped > 0 {
		fmt.Fprintf(out, "skipped %s\n", plural(int64(skipped), "empty line"))
	}
	return nil
}

// sender pipelines asynchronous sends, at most cap(sem) in flight, and keeps
// the first error.
type sender struct {
	p   *client.Producer
	sem chan struct{}
	bar *progressbar.ProgressBar
	wg  sync.WaitGroup
	mu  struct {
		sync.Mutex
		err  error
		sent int64
	}
}

func (s *sender) send(ctx context.Context, m *client.Message) error {
	if err := s.firstErr(); err != nil {
		return err
	}
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	s.wg.Add(1)
	s.p.SendAsync(ctx, func(_ client.SendResult, err error) {
		defer s.wg.Done()
		s.mu.Lock()
		if err != nil && s.mu.err == nil {
			s.mu.err = err
		}
		if err == nil {
			s.mu.sent++
		}
		s.mu.Unlock()
		<-s.sem
		if err == nil {
			_ = s.bar.Add(1) // drawing errors are not the send's
		}
	}, m)
	return nil
}

func (s *sender) firstErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.err
}

func (s *sender) wait() error { s.wg.Wait(); return s.firstErr() }

func (s *sender) done() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.sent
}

// isTerminal reports whether w is a terminal (a character device, as
// stderr is in an interactive shell; not a file or a pipe).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// countLines counts the messages a file holds (a last line without newline
// counts).
func countLines(r io.Reader) (int64, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var n int64
	var last byte = '\n'
	buf := make([]byte, 64<<10)
	for {
		k, err := br.Read(buf)
		for _, b := range buf[:k] {
			if b == '\n' {
				n++
			}
		}
		if k > 0 {
			last = buf[k-1]
		}
		if errors.Is(err, io.EOF) {
			if last != '\n' {
				n++
			}
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}
