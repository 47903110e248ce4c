// Package clicks is the job of the windows example: click events counted
// per user in 1-minute tumbling event-time windows and in 30-minute
// sessions, with late clicks going to side outputs. It is a package (not
// only the example's main) so that the end-to-end crash tests run the very
// same job.
package clicks

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/pipeline/window"
	"github.com/runnel-dev/runnel/source"
)

// Click is one click event.
type Click struct {
	User string    `json:"user"`
	Page string    `json:"page"`
	At   time.Time `json:"at"`
}

// String renders the click as "user page at".
func (c Click) String() string {
	return fmt.Sprintf("%s %s %s", c.User, c.Page, c.At.UTC().Format(time.TimeOnly))
}

// Options are the job's time settings.
type Options struct {
	// MaxOutOfOrder bounds how far behind the newest click of a source
	// split a click may arrive without being late (the watermark lag).
	MaxOutOfOrder time.Duration
	// Minute is the tumbling window size (1 minute).
	Minute time.Duration
	// SessionGap ends a user's session after this long without clicks
	// (30 minutes).
	SessionGap time.Duration
	// Lateness is how long windows accept late clicks after they fired,
	// re-firing with updated counts.
	Lateness time.Duration
}

// DefaultOptions returns the example's settings.
func DefaultOptions() Options {
	return Options{MaxOutOfOrder: 10 * time.Second, Minute: time.Minute, SessionGap: 30 * time.Minute, Lateness: time.Minute}
}

// Outputs are the job's result streams.
type Outputs struct {
	// PerMinute counts each user's clicks per minute.
	PerMinute *pipeline.Stream[window.Result[string, int64]]
	// Sessions counts each user's clicks per session.
	Sessions *pipeline.Stream[window.Result[string, int64]]
	// LateForMinute and LateForSession are the clicks that came after
	// their windows expired.
	LateForMinute  *pipeline.Stream[Click]
	LateForSession *pipeline.Stream[Click]
}

// Build adds the job reading clicks from src: event time from Click.At,
// bounded out-of-orderness watermarks per split, the two window operators
// and their late-click side outputs.
func Build(job *pipeline.Job, src source.Source[Click], o Options, opts ...pipeline.SourceOption) Outputs {
	opts = append([]pipeline.SourceOption{pipeline.BoundedOutOfOrderness(o.MaxOutOfOrder)}, opts...)
	clicks := pipeline.FromSource(job, "clicks", src, opts...).
		WithTimestamps(func(c Click) time.Time { return c.At })
	byUser := pipeline.KeyBy(clicks, func(c Click) string { return c.User })
	lateMinute := pipeline.NewOutputTag[Click]("late-minute")
	lateSession := pipeline.NewOutputTag[Click]("late-session")
	perMinute := window.Apply(byUser, "clicks-per-minute", window.Tumbling(o.Minute), window.Count[Click](),
		window.AllowedLateness(o.Lateness), window.LateRecords(lateMinute))
	sessions := window.Apply(byUser, "clicks-per-session", window.Session(o.SessionGap), window.Count[Click](),
		window.AllowedLateness(o.Lateness), window.LateRecords(lateSession))
	return Outputs{
		PerMinute:      perMinute,
		Sessions:       sessions,
		LateForMinute:  pipeline.SideOutput(perMinute, lateMinute),
		LateForSession: pipeline.SideOutput(sessions, lateSession),
	}
}

// Origin returns the event time of the generator's first click.
func Origin() time.Time { return time.Date(2025, 1, 6, 9, 0, 0, 0, time.UTC) }

// Generator settings: a click every Step per split; Users users in two
// halves that take turns being active for PhaseLength (longer than a
// session gap, so sessions end); every LateEvery-th click is LateBy behind
// (around the minute windows' lateness: some re-fire a window, some are
// late), every VeryLateEvery-th click VeryLateBy behind (late for its
// minute, often merged into a session).
const (
	Step          = 250 * time.Millisecond
	Users         = 40
	PhaseLength   = 35 * time.Minute
	LateEvery     = 101
	LateBy        = 90 * time.Second
	VeryLateEvery = 211
	VeryLateBy    = 10 * time.Minute
	maxJitter     = 5 * time.Second // below DefaultOptions().MaxOutOfOrder
)

// Gen is the deterministic click seq of split split (for
// source.NewGenerator): on time within the out-of-orderness bound, except
// the deliberately late ones.
func Gen(split int, seq uint64) Click {
	h := hash(uint64(split), seq)
	at := Origin().Add(time.Duration(seq)*Step + time.Duration(h%uint64(maxJitter/time.Millisecond))*time.Millisecond)
	switch {
	case seq%VeryLateEvery == 7:
		at = at.Add(-VeryLateBy)
	case seq%LateEvery == 50:
		at = at.Add(-LateBy)
	}
	phase := uint64(at.Sub(Origin().Add(-VeryLateBy)) / PhaseLength % 2)
	user := (h>>20)%(Users/2)*2 + phase
	page := [...]string{"/", "/cart", "/search", "/item"}[(h>>40)%4]
	return Click{User: fmt.Sprintf("user-%02d", user), Page: page, At: at}
}

// hash mixes split and seq (splitmix64's finalizer).
func hash(split, seq uint64) uint64 {
	x := split*0x9e3779b97f4a7c15 + seq + 1
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// ResultKey is a stable, unique key of a window result (kind, user,
// window, firing): an idempotent sink keyed by it holds every firing
// exactly once.
func ResultKey(kind string, r window.Result[string, int64]) []byte {
	k := append([]byte(kind+"|"+r.Key+"|"), 0)
	k = binary.BigEndian.AppendUint64(k, uint64(r.Start.UnixNano()))
	k = binary.BigEndian.AppendUint64(k, uint64(r.End.UnixNano()))
	return binary.BigEndian.AppendUint32(k, uint32(r.Firing))
}

// LateKey is a stable key of a late click (kind, user, time, page).
func LateKey(kind string, c Click) []byte {
	k := append([]byte(kind+"|"+c.User+"|"+c.Page+"|"), 0)
	return binary.BigEndian.AppendUint64(k, uint64(c.At.UnixNano()))
}
