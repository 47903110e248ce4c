// Package sourcetest is a conformance suite for source.Source
// implementations: one call runs a source through the contract of package
// source, the way watermill's pubsub/tests.TestPubSub runs a Pub/Sub
// through watermill's. Every source in runnel passes it (source.Slice and
// Generator, source/rocketmq, source/wmsource), and a source written
// outside runnel can run the same checks from its own tests:
//
//	func TestConformance(t *testing.T) {
//		sourcetest.Run(t, sourcetest.Features{}, func(t *testing.T, n int) sourcetest.Instance[Line] {
//			dir := t.TempDir()
//			keys := writeLines(t, dir, n) // n records the source will read, their keys
//			return sourcetest.Instance[Line]{
//				Source:  mysource.New(dir),
//				Key:     func(l Line) string { return l.Text },
//				Records: keys,
//				Produce: func(ctx context.Context, n int) ([]string, error) { return appendLines(dir, n) },
//			}
//		})
//	}
//
// The factory is called once per check with the number of records the new
// instance must hold before it is first opened (Features.Records); it
// returns an Instance over a fresh part of the system under test (its own
// topic, directory or table), the keys of those records, and the means to
// make more records appear (Produce) and to add splits (AddSplits) where
// the source supports it. Keys identify records: every record the instance
// ever holds has a key of its own. Cleanup of what the factory made (a
// broker, a client) belongs to the factory: use t.Cleanup.
//
// # What is checked
//
// Each check is a subtest of the test Run is called from, on a new
// instance:
//
//   - Splits: Splits lists at least one split, IDs are non-empty and
//     unique, and a second call lists the same splits.
//   - ReadAll: every split opened at nil (the start position) and read,
//     one goroutine per split: together they return every record exactly
//     once, and nothing else. Poll never returns more than max records;
//     a bounded split then returns source.ErrEndOfSplit with no records, and
//     again on every later call; an unbounded one returns nothing more
//     while the suite waits Features.Quiet.
//   - CancelledPolls: the same read with every Poll preceded by one whose
//     ctx is already cancelled: such a Poll returns within Features.Prompt,
//     with records or with none, and loses nothing: every record still
//     comes exactly once, and a reader opened at the Offset read right
//     after a cancelled Poll resumes exactly there.
//   - PollHonoursContext (unbounded sources with Produce): on a drained
//     split, a Poll whose ctx ends returns within Features.Prompt with no
//     records and a nil or ctx error; records produced afterwards are all
//     returned, exactly once.
//   - Restore: the splits are read in small batches (max 1, 2, 3), Offset
//     noted after every Poll and NotifyCheckpointComplete called after it
//     (it must return nil), as the runtime does at each checkpoint. Then a new reader is opened
//     at every noted offset, at the offset noted before the first Poll, and
//     at every Record.Offset, and it must return exactly the records that
//     followed that point, in the same order: no loss, no repeat (with
//     Features.AtLeastOnce: at least those, in any order, and nothing that
//     is not a record of the split's source). The slices Offset returns
//     belong to the caller: the reader must not change them later, and
//     changing one must not change the reader; two calls with no Poll
//     between return the same offset.
//   - BadOffset: Open with bytes that are no offset of the source fails
//     with an error wrapping source.ErrBadOffset.
//   - Discovery (sources implementing source.Discoverer): DiscoverSplits
//     lists every split Splits lists; with AddSplits, a split added to the
//     system is listed within Features.Timeout, and readers opened on the
//     new splits at nil return exactly the records put in them, while the
//     readers of the old splits return nothing new.
//
// Every reader the suite opens is closed exactly once, and Close must
// return nil. Readers of different splits are used from different
// goroutines at once (the runtime runs a task per split), each reader from
// one goroutine at a time.
//
// # Features
//
// Features says what differs between sources: bounded or not (Bounded),
// endless generators whose splits never run dry (Endless), sources that
// cannot seek and redeliver after a restore (AtLeastOnce, as wmsource over
// watermill subscribers), and the sizes and time bounds of the checks.
// Declare them honestly: a Feature weakens exactly the checks it names, and
// nothing else.
//
// # Failing
//
// A check fails its subtest with what it saw: the split, the restore point
// (how many records were returned before it), and the records missing,
// repeated or unexpected. A call that does not return within
// Features.Timeout fails the subtest instead of hanging the test binary;
// the reader is then left unclosed.
package sourcetest
