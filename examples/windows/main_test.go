package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/runnel-dev/runnel/examples/windows/clicks"
	"github.com/runnel-dev/runnel/source"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// onePerPoll is a one-split source returning one click per Poll, so that
// the watermark advances after every click and lateness is exactly
// determined by the input order.
type onePerPoll []clicks.Click

func (s onePerPoll) Splits(context.Context) ([]source.Split, error) {
	return []source.Split{{ID: "0"}}, nil
}

func (s onePerPoll) Open(_ context.Context, _ source.Split, restored []byte) (source.SplitReader[clicks.Click], error) {
	r := &pollReader{clicks: s}
	if len(restored) == 8 {
		r.next = int(binary.BigEndian.Uint64(restored))
	}
	return r, nil
}

type pollReader struct {
	clicks []clicks.Click
	next   int
}

func (r *pollReader) Poll(context.Context, int) ([]source.Record[clicks.Click], error) {
	if r.next >= len(r.clicks) {
		return nil, source.ErrEndOfSplit
	}
	r.next++
	return []source.Record[clicks.Click]{{Value: r.clicks[r.next-1], Offset: r.Offset()}}, nil
}

func (r *pollReader) Offset() []byte { return binary.BigEndian.AppendUint64(nil, uint64(r.next)) }

func (r *pollReader) NotifyCheckpointComplete(context.Context, uint64) error { return nil }

func (r *pollReader) Close() error { return nil }

func click(user, hms string) clicks.Click {
	t, err := time.Parse(time.DateTime, "2025-01-06 "+hms)
	if err != nil {
		panic(err)
	}
	return clicks.Click{User: user, Page: "/", At: t}
}

// Example: the watermark trails the newest click by 10 s; minute windows
// accept late clicks for 1 minute after they fire, then send them to the
// late output; sessions end 30 minutes after a user's last click.
func Example() {
	in := onePerPoll{
		click("alice", "09:00:05"),
		click("bob", "09:00:20"),
		click("alice", "09:00:40"),
		click("alice", "09:01:15"), // watermark 09:01:05: minute 09:00 fires
		click("alice", "09:00:50"), // late, within the lateness: minute 09:00 re-fires (firing=1)
		click("bob", "09:02:30"),   // watermark 09:02:20: minute 09:00 expires
		click("bob", "09:00:30"),   // too late for its minute; still joins bob's session
		click("carol", "09:40:00"), // watermark 09:39:50: the first sessions end
		click("alice", "09:10:00"), // too late for its minute, but its session is not
	}
	if err := run(context.Background(), os.Stdout, in, ""); err != nil {
		panic(err)
	}
	// Output:
	// late    minute alice / 09:10:00
	// late    minute bob / 09:00:30
	// minute  alice 09:00:00-09:01:00 count=2 firing=0
	// minute  alice 09:00:00-09:01:00 count=3 firing=1
	// minute  alice 09:01:00-09:02:00 count=1 firing=0
	// minute  bob 09:00:00-09:01:00 count=1 firing=0
	// minute  bob 09:02:00-09:03:00 count=1 firing=0
	// minute  carol 09:40:00-09:41:00 count=1 firing=0
	// session alice 09:00:05-09:31:15 count=4 firing=0
	// session alice 09:10:00-09:40:00 count=1 firing=0
	// session bob 09:00:20-09:32:30 count=3 firing=0
	// session carol 09:40:00-10:10:00 count=1 firing=0
}

var minuteLine = regexp.MustCompile(`^minute  (\S+) (\S+)-\S+ count=(\d+) firing=(\d+)$`)

// TestGeneratedClicksConserved runs the example on generated clicks (with
// deliberately late ones) and checks that every click is counted exactly
// once: in the last firing of its minute window or in the late output.
func TestGeneratedClicksConserved(t *testing.T) {
	const perSplit, splits = 3000, 2
	var buf bytes.Buffer
	if err := run(context.Background(), &buf, source.NewGenerator(splits, perSplit, clicks.Gen), t.TempDir()); err != nil {
		t.Fatal(err)
	}
	last := map[string][2]int{} // user+start -> (firing, count)
	late, refired := 0, 0
	sc := bufio.NewScanner(&buf)
	for sc.Scan() {
		line := sc.Text()
		if m := minuteLine.FindStringSubmatch(line); m != nil {
			n, _ := strconv.Atoi(m[3])
			f, _ := strconv.Atoi(m[4])
			if f > 0 {
				refired++
			}
			k := m[1] + " " + m[2]
			if prev, ok := last[k]; !ok || f > prev[0] {
				last[k] = [2]int{f, n}
			}
		} else if bytes.HasPrefix([]byte(line), []byte("late    minute")) {
			late++
		}
	}
	total := 0
	for _, v := range last {
		total += v[1]
	}
	if total+late != perSplit*splits {
		t.Fatalf("counted %d + late %d = %d clicks, want %d", total, late, total+late, perSplit*splits)
	}
	if late == 0 || refired == 0 {
		t.Fatalf("the generated data should produce late clicks (%d) and re-fired windows (%d)", late, refired)
	}
	t.Logf("%d windows, %d re-firings, %d late clicks", len(last), refired, late)
}
