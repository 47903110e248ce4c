package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

func TestPutDenseOffsetsAndPatching(t *testing.T) {
	clk := &testClock{}
	clk.ms.Store(1_000)
	s := openTest(t, t.TempDir(), Options{Clock: clk.now})
	defer s.Close()

	var physEnd int64
	want := map[queueKey]int64{}
	for i := range 60 {
		topic := fmt.Sprintf("T%d", i%2)
		q := int32(i % 3)
		m := msg(topic, q, fmt.Sprintf("body-%d", i))
		clk.ms.Add(1)
		res := mustPut(t, s, m)[0]
		k := queueKey{topic, q}
		if res.QueueOffset != want[k] {
			t.Fatalf("msg %d: queue offset %d, want %d", i, res.QueueOffset, want[k])
		}
		want[k]++
		if res.PhysicalOffset != physEnd {
			t.Fatalf("msg %d: physical offset %d, want %d", i, res.PhysicalOffset, physEnd)
		}
		physEnd += int64(len(m.Record))
		if res.StoreTimestamp != clk.ms.Load() {
			t.Fatalf("store timestamp %d, want %d", res.StoreTimestamp, clk.ms.Load())
		}
		// Patched in place.
		if recQueueOffset(m.Record) != res.QueueOffset || recordPhys(m.Record) != res.PhysicalOffset ||
			recStoreTS(m.Record, m.StoreTimestampPos) != res.StoreTimestamp {
			t.Fatalf("record not patched: %x", m.Record[:64])
		}
	}
	for k, n := range want {
		if got := mustOffset(t, s.MaxOffset, k.topic, k.id); got != n {
			t.Fatalf("%v: max %d want %d", k, got, n)
		}
		if got := mustOffset(t, s.MinOffset, k.topic, k.id); got != 0 {
			t.Fatalf("%v: min %d", k, got)
		}
		recs := getAll(t, s, k.topic, k.id, 0)
		if int64(len(recs)) != n {
			t.Fatalf("%v: got %d records want %d", k, len(recs), n)
		}
		for i, r := range recs {
			if recQueueOffset(r) != int64(i) {
				t.Fatalf("%v: record %d has offset %d", k, i, recQueueOffset(r))
			}
		}
	}
	if got, _ := s.MaxOffset("nope", 0); got != 0 {
		t.Fatalf("unknown queue max %d", got)
	}
	ids, _ := s.QueueIDs("T0")
	if !slices.Equal(ids, []int32{0, 1, 2}) {
		t.Fatalf("QueueIDs %v", ids)
	}
	topics, _ := s.Topics()
	if !slices.Equal(topics, []string{"T0", "T1"}) {
		t.Fatalf("Topics %v", topics)
	}
}

func TestPutBatchAndIPv6Position(t *testing.T) {
	s := openTest(t, t.TempDir(), Options{})
	defer s.Close()
	mustPut(t, s, msg("A", 0, "x"))
	rec6, pos6 := makeRecord("A", 1, []byte("v6"), true)
	if pos6 != 68 {
		t.Fatalf("test record v6 ts pos %d", pos6)
	}
	batch := []PutMessage{msg("A", 0, "b1"), msg("A", 0, "b2"), {Topic: "A", QueueID: 1, Record: rec6, StoreTimestampPos: pos6}, msg("A", 0, "b3")}
	res := mustPut(t, s, batch...)
	wantOff := []int64{1, 2, 0, 3}
	for i, r := range res {
		if r.QueueOffset != wantOff[i] {
			t.Fatalf("batch %d: offset %d want %d", i, r.QueueOffset, wantOff[i])
		}
		if i > 0 && r.PhysicalOffset != res[i-1].PhysicalOffset+int64(len(batch[i-1].Record)) {
			t.Fatalf("batch physical offsets not contiguous: %+v", res)
		}
	}
	if got := recStoreTS(rec6, 68); got != res[2].StoreTimestamp {
		t.Fatalf("v6 store ts %d want %d", got, res[2].StoreTimestamp)
	}
	got := getAll(t, s, "A", 0, 0)
	for i, body := range []string{"x", "b1", "b2", "b3"} {
		if string(recordBody(got[i])) != body {
			t.Fatalf("record %d body %q", i, recordBody(got[i]))
		}
	}
}

func TestPutValidation(t *testing.T) {
	s := openTest(t, t.TempDir(), Options{MaxRecordBytes: 4096})
	defer s.Close()
	good := msg("A", 0, "ok")
	badSize := msg("A", 0, "x")
	binary.BigEndian.PutUint32(badSize.Record, 7)
	big, pos := makeRecord("A", 0, make([]byte, 5000), false)
	tooManyKeys := msg("A", 0, "k")
	for range MaxKeysPerMessage + 1 {
		tooManyKeys.Keys = append(tooManyKeys.Keys, "k")
	}
	cases := map[string][]PutMessage{
		"empty":         nil,
		"no topic":      {{QueueID: 0, Record: good.Record, StoreTimestampPos: 56}},
		"neg queue":     {{Topic: "A", QueueID: -1, Record: good.Record, StoreTimestampPos: 56}},
		"short record":  {{Topic: "A", Record: []byte{0, 0, 0, 8, 1, 2, 3, 4}, StoreTimestampPos: 56}},
		"totalsize":     {badSize},
		"too big":       {{Topic: "A", Record: big, StoreTimestampPos: pos}},
		"ts pos low":    {{Topic: "A", Record: good.Record, StoreTimestampPos: 20}},
		"ts pos high":   {{Topic: "A", Record: good.Record, StoreTimestampPos: len(good.Record) - 7}},
		"empty key":     {msg("A", 0, "k", "")},
		"too many keys": {tooManyKeys},
		"one bad":       {good, badSize},
	}
	for name, msgs := range cases {
		if _, err := s.Put(context.Background(), msgs); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err %v, want ErrInvalid", name, err)
		}
	}
	if max, _ := s.MaxOffset("A", 0); max != 0 {
		t.Fatalf("invalid Put wrote: max %d", max)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Put(ctx, []PutMessage{msg("A", 0, "c")}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled ctx: %v", err)
	}
	if _, err := Open(t.TempDir(), Options{FlushMode: 7}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad flush mode: %v", err)
	}
}

func TestGetLimitsAndFiltering(t *testing.T) {
	s := openTest(t, t.TempDir(), Options{})
	defer s.Close()
	var size int
	for i := range 10 {
		m := msg("G", 2, fmt.Sprintf("m%d", i))
		m.TagsCode = int64(i % 2)
		size = len(m.Record)
		mustPut(t, s, m)
	}
	all := func([]byte, int64) bool { return true }

	// maxMsgs.
	var got []int64
	next, err := s.Get("G", 2, 0, 3, 0, func(rec []byte, _ int64) bool {
		got = append(got, recQueueOffset(rec))
		return true
	})
	if err != nil || next != 3 || !slices.Equal(got, []int64{0, 1, 2}) {
		t.Fatalf("maxMsgs: next %d got %v err %v", next, got, err)
	}
	// maxBytes: room for two and a half records -> 2.
	n := 0
	next, _ = s.Get("G", 2, 4, 32, size*2+size/2, func([]byte, int64) bool { n++; return true })
	if n != 2 || next != 6 {
		t.Fatalf("maxBytes: n %d next %d", n, next)
	}
	// The first message is taken even if larger than maxBytes.
	n = 0
	next, _ = s.Get("G", 2, 4, 32, 1, func([]byte, int64) bool { n++; return true })
	if n != 1 || next != 5 {
		t.Fatalf("first message: n %d next %d", n, next)
	}
	// Tag filtering: only odd tags codes, 2 wanted; next passes filtered entries.
	got = got[:0]
	next, _ = s.Get("G", 2, 0, 2, 0, func(rec []byte, tags int64) bool {
		if tags != 1 {
			return false
		}
		got = append(got, recQueueOffset(rec))
		return true
	})
	if next != 4 || !slices.Equal(got, []int64{1, 3}) {
		t.Fatalf("filter: next %d got %v", next, got)
	}
	// Everything filtered: next advances to the end.
	next, _ = s.Get("G", 2, 0, 32, 0, func([]byte, int64) bool { return false })
	if next != 10 {
		t.Fatalf("all filtered: next %d", next)
	}
	// Caught up and beyond.
	if next, _ := s.Get("G", 2, 10, 32, 0, all); next != 10 {
		t.Fatalf("caught up: next %d", next)
	}
	if next, _ := s.Get("G", 2, 50, 32, 0, all); next != 50 {
		t.Fatalf("overflow: next %d", next)
	}
	if next, _ := s.Get("nope", 0, 0, 32, 0, all); next != 0 {
		t.Fatalf("unknown queue: next %d", next)
	}
	if _, err := s.Get("G", 2, 0, 0, 0, all); !errors.Is(err, ErrInvalid) {
		t.Fatalf("maxMsgs 0: %v", err)
	}
}

func TestGetScanBound(t *testing.T) {
	s := openTest(t, t.TempDir(), Options{FlushMode: FlushAsync})
	defer s.Close()
	batch := make([]PutMessage, MaxScanPerGet+10)
	for i := range batch {
		batch[i] = msg("S", 0, "")
	}
	mustPut(t, s, batch...)
	scanned := 0
	next, err := s.Get("S", 0, 0, 32, 0, func([]byte, int64) bool { scanned++; return false })
	if err != nil || scanned != MaxScanPerGet || next != MaxScanPerGet {
		t.Fatalf("scan bound: scanned %d next %d err %v", scanned, next, err)
	}
}

func TestSearchOffsetAndEarliest(t *testing.T) {
	clk := &testClock{}
	s := openTest(t, t.TempDir(), Options{Clock: clk.now})
	defer s.Close()
	if off, _ := s.SearchOffset("Q", 0, 5, false); off != 0 {
		t.Fatalf("unknown queue: %d", off)
	}
	if _, err := s.EarliestStoreTime("Q", 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("earliest unknown: %v", err)
	}
	// Offsets 0..5 at times 1000,1000,2000,3000,3000,4000.
	for _, ts := range []int64{1000, 1000, 2000, 3000, 3000, 4000} {
		clk.ms.Store(ts)
		mustPut(t, s, msg("Q", 0, "x"))
	}
	cases := []struct {
		ts    int64
		upper bool
		want  int64
	}{
		{500, false, 0}, {1000, false, 0}, {1500, false, 2}, {3000, false, 3}, {4000, false, 5}, {4001, false, 6},
		{500, true, 0}, {1000, true, 1}, {2999, true, 2}, {3000, true, 4}, {4000, true, 5}, {9999, true, 5},
	}
	for _, c := range cases {
		if got, err := s.SearchOffset("Q", 0, c.ts, c.upper); err != nil || got != c.want {
			t.Errorf("SearchOffset(%d, upper=%v) = %d, %v; want %d", c.ts, c.upper, got, err, c.want)
		}
	}
	if ts, err := s.EarliestStoreTime("Q", 0); err != nil || ts != 1000 {
		t.Fatalf("earliest %d %v", ts, err)
	}
	if err := s.TruncateBefore("Q", 0, 3); err != nil {
		t.Fatal(err)
	}
	if ts, err := s.EarliestStoreTime("Q", 0); err != nil || ts != 3000 {
		t.Fatalf("earliest after truncate %d %v", ts, err)
	}
	if got, _ := s.SearchOffset("Q", 0, 500, false); got != 3 {
		t.Fatalf("search below min after truncate: %d", got)
	}
	if got, _ := s.SearchOffset("Q", 0, 500, true); got != 3 {
		t.Fatalf("upper search below min after truncate: %d", got)
	}
	// A clock going backwards does not make store times decrease.
	clk.ms.Store(10)
	res := mustPut(t, s, msg("Q", 0, "late"))
	if res[0].StoreTimestamp != 4000 {
		t.Fatalf("clock went back: store ts %d", res[0].StoreTimestamp)
	}
}

func TestGetByPhysicalOffset(t *testing.T) {
	s := openTest(t, t.TempDir(), Options{})
	defer s.Close()
	var res []PutResult
	var bodies []string
	for i := range 20 {
		b := fmt.Sprintf("phys-%d", i)
		bodies = append(bodies, b)
		res = append(res, mustPut(t, s, msg(fmt.Sprintf("P%d", i%3), int32(i%2), b))...)
	}
	for i, r := range res {
		rec, err := s.GetByPhysicalOffset(r.PhysicalOffset)
		if err != nil {
			t.Fatalf("phys %d: %v", r.PhysicalOffset, err)
		}
		if string(recordBody(rec)) != bodies[i] || recordPhys(rec) != r.PhysicalOffset {
			t.Fatalf("phys %d: wrong record", r.PhysicalOffset)
		}
	}
	for _, p := range []int64{-1, 1, res[1].PhysicalOffset + 3, 1 << 40} {
		if _, err := s.GetByPhysicalOffset(p); !errors.Is(err, ErrNotFound) {
			t.Fatalf("phys %d: %v, want ErrNotFound", p, err)
		}
	}
}

func TestQueryByKey(t *testing.T) {
	clk := &testClock{}
	s := openTest(t, t.TempDir(), Options{Clock: clk.now})
	defer s.Close()
	for i := range 10 {
		clk.ms.Store(int64(1000 * (i + 1)))
		keys := []string{fmt.Sprintf("uniq-%d", i)}
		if i%2 == 0 {
			keys = append(keys, "even")
		}
		mustPut(t, s, msg("K", int32(i%3), fmt.Sprint(i), keys...))
		mustPut(t, s, msg("Other", 0, "o", "even"))
	}
	bodies := func(recs [][]byte) []string {
		var out []string
		for _, r := range recs {
			out = append(out, string(recordBody(r)))
		}
		return out
	}
	recs, err := s.QueryByKey("K", "even", 100, 0, 1<<62)
	if err != nil || !slices.Equal(bodies(recs), []string{"8", "6", "4", "2", "0"}) {
		t.Fatalf("even: %v %v", bodies(recs), err)
	}
	recs, _ = s.QueryByKey("K", "even", 2, 0, 1<<62)
	if !slices.Equal(bodies(recs), []string{"8", "6"}) {
		t.Fatalf("maxNum: %v", bodies(recs))
	}
	recs, _ = s.QueryByKey("K", "even", 100, 3000, 7000) // bounds inclusive
	if !slices.Equal(bodies(recs), []string{"6", "4", "2"}) {
		t.Fatalf("time range: %v", bodies(recs))
	}
	recs, _ = s.QueryByKey("K", "even", 100, 3001, 6999)
	if !slices.Equal(bodies(recs), []string{"4"}) {
		t.Fatalf("time range: %v", bodies(recs))
	}
	recs, _ = s.QueryByKey("K", "uniq-7", 100, -1<<63, 1<<63-1)
	if !slices.Equal(bodies(recs), []string{"7"}) {
		t.Fatalf("uniq: %v", bodies(recs))
	}
	recs, _ = s.QueryByKey("K", "missing", 100, 0, 1<<62)
	if len(recs) != 0 {
		t.Fatalf("missing: %v", bodies(recs))
	}
	// Retention removes index entries: queue 0 holds 0,3,6,9.
	if err := s.TruncateBefore("K", 0, 2); err != nil {
		t.Fatal(err)
	}
	recs, _ = s.QueryByKey("K", "even", 100, 0, 1<<62)
	if !slices.Equal(bodies(recs), []string{"8", "6", "4", "2"}) {
		t.Fatalf("after truncate: %v", bodies(recs))
	}
	if n := countPrefix(t, s, appendKeyIndexPrefix(nil, "K", "uniq-3")); n != 0 {
		t.Fatalf("key index entries of truncated message remain: %d", n)
	}
}

func countPrefix(t testing.TB, s *Store, prefix []byte) int {
	t.Helper()
	n := 0
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
	if err != nil {
		t.Fatal(err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		n++
	}
	if err := it.Close(); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestTruncateBefore(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir, Options{})
	var res []PutResult
	for i := range 10 {
		res = append(res, mustPut(t, s, msg("R", 1, fmt.Sprint(i), fmt.Sprint("key", i)))...)
	}
	if err := s.TruncateBefore("R", 1, 4); err != nil {
		t.Fatal(err)
	}
	if min, _ := s.MinOffset("R", 1); min != 4 {
		t.Fatalf("min %d", min)
	}
	if err := s.TruncateBefore("R", 1, 2); err != nil { // no-op
		t.Fatal(err)
	}
	if min, _ := s.MinOffset("R", 1); min != 4 {
		t.Fatalf("min moved back: %d", min)
	}
	recs := getAll(t, s, "R", 1, 0) // below min starts at min
	if len(recs) != 6 || recQueueOffset(recs[0]) != 4 {
		t.Fatalf("after truncate: %d records", len(recs))
	}
	if _, err := s.GetByPhysicalOffset(res[3].PhysicalOffset); !errors.Is(err, ErrNotFound) {
		t.Fatalf("truncated phys: %v", err)
	}
	if _, err := s.GetByPhysicalOffset(res[4].PhysicalOffset); err != nil {
		t.Fatalf("kept phys: %v", err)
	}
	if n := countPrefix(t, s, []byte{prefixPhys}); n != 6 {
		t.Fatalf("%d physical index entries, want 6", n)
	}
	// Beyond max clamps; the queue is empty, min == max, offsets continue.
	if err := s.TruncateBefore("R", 1, 100); err != nil {
		t.Fatal(err)
	}
	if min, _ := s.MinOffset("R", 1); min != 10 {
		t.Fatalf("min %d", min)
	}
	if err := s.TruncateBefore("none", 0, 5); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, dir, Options{})
	defer s.Close()
	if min, _ := s.MinOffset("R", 1); min != 10 {
		t.Fatalf("min after reopen %d", min)
	}
	if r := mustPut(t, s, msg("R", 1, "next")); r[0].QueueOffset != 10 {
		t.Fatalf("offset after reopen %d", r[0].QueueOffset)
	}
}

func TestConsumerOffsets(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir, Options{})
	if _, ok, err := s.QueryOffset("g", "T", 0); ok || err != nil {
		t.Fatalf("unset offset: %v %v", ok, err)
	}
	for q := range int32(4) {
		if err := s.CommitOffset("g", "T", q, int64(q*10)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CommitOffset("g", "T", 1, 99); err != nil {
		t.Fatal(err)
	}
	if err := s.CommitOffset("g2", "T", 0, 7); err != nil {
		t.Fatal(err)
	}
	if err := s.CommitOffset("g", "U", 0, 5); err != nil {
		t.Fatal(err)
	}
	if err := s.CommitOffset("g", "T", 0, -1); !errors.Is(err, ErrInvalid) {
		t.Fatalf("negative offset: %v", err)
	}
	if off, ok, _ := s.QueryOffset("g", "T", 1); !ok || off != 99 {
		t.Fatalf("query: %d %v", off, ok)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, dir, Options{})
	defer s.Close()
	m, err := s.ConsumerOffsets("g", "T")
	if err != nil || len(m) != 4 || m[1] != 99 || m[3] != 30 {
		t.Fatalf("ConsumerOffsets after reopen: %v %v", m, err)
	}
	if err := s.DeleteGroup("g"); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.QueryOffset("g", "U", 0); ok {
		t.Fatal("offset survives DeleteGroup")
	}
	if off, ok, _ := s.QueryOffset("g2", "T", 0); !ok || off != 7 {
		t.Fatal("DeleteGroup removed another group's offset")
	}
}

func TestConfigsAndMeta(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir, Options{})
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(s.PutTopicConfig("A", []byte("cfgA")))
	must(s.PutTopicConfig("B", []byte("cfgB")))
	must(s.PutTopicConfig("A", []byte("cfgA2")))
	must(s.PutGroupConfig("G", []byte("grp")))
	must(s.PutMeta([]byte("trans/1"), []byte("op1")))
	must(s.PutMeta([]byte("trans/2"), []byte("op2")))
	must(s.PutMeta([]byte("delay/3"), []byte{}))
	must(s.DeleteMeta([]byte("trans/1")))
	if err := s.PutMeta(nil, []byte("x")); !errors.Is(err, ErrInvalid) {
		t.Fatalf("empty meta key: %v", err)
	}
	must(s.Close())

	s = openTest(t, dir, Options{})
	defer s.Close()
	tc, err := s.TopicConfigs()
	if err != nil || len(tc) != 2 || string(tc["A"]) != "cfgA2" || string(tc["B"]) != "cfgB" {
		t.Fatalf("TopicConfigs %q %v", tc, err)
	}
	if v, ok, _ := s.TopicConfig("B"); !ok || string(v) != "cfgB" {
		t.Fatalf("TopicConfig %q %v", v, ok)
	}
	if _, ok, _ := s.TopicConfig("C"); ok {
		t.Fatal("missing topic config found")
	}
	gc, _ := s.GroupConfigs()
	if len(gc) != 1 || string(gc["G"]) != "grp" {
		t.Fatalf("GroupConfigs %q", gc)
	}
	var keys []string
	must(s.ScanMeta([]byte("trans/"), func(k, v []byte) bool {
		keys = append(keys, string(k)+"="+string(v))
		return true
	}))
	if !slices.Equal(keys, []string{"trans/2=op2"}) {
		t.Fatalf("ScanMeta %v", keys)
	}
	if v, ok, _ := s.GetMeta([]byte("delay/3")); !ok || len(v) != 0 {
		t.Fatalf("empty meta value: %q %v", v, ok)
	}
	must(s.DeleteGroup("G"))
	if _, ok, _ := s.GroupConfig("G"); ok {
		t.Fatal("group config survives DeleteGroup")
	}
}

func TestDeleteTopic(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir, Options{})
	var delRes []PutResult
	for i := range 30 {
		delRes = append(delRes, mustPut(t, s, msg("Del", int32(i%3), fmt.Sprint(i), "k"))...)
		mustPut(t, s, msg("Keep", 0, fmt.Sprint(i), "k"))
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(s.PutTopicConfig("Del", []byte("c")))
	must(s.PutTopicConfig("Keep", []byte("c")))
	must(s.CommitOffset("g", "Del", 0, 3))
	must(s.CommitOffset("g", "Keep", 0, 3))
	must(s.DeleteTopic("Del"))

	check := func(s *Store) {
		t.Helper()
		if ids, _ := s.QueueIDs("Del"); len(ids) != 0 {
			t.Fatalf("queues remain: %v", ids)
		}
		if max, _ := s.MaxOffset("Del", 1); max != 0 {
			t.Fatalf("max %d", max)
		}
		if _, ok, _ := s.TopicConfig("Del"); ok {
			t.Fatal("config remains")
		}
		if _, ok, _ := s.QueryOffset("g", "Del", 0); ok {
			t.Fatal("consumer offset remains")
		}
		if recs, _ := s.QueryByKey("Del", "k", 100, 0, 1<<62); len(recs) != 0 {
			t.Fatalf("key query finds %d", len(recs))
		}
		for _, r := range delRes {
			if _, err := s.GetByPhysicalOffset(r.PhysicalOffset); !errors.Is(err, ErrNotFound) {
				t.Fatalf("phys %d: %v", r.PhysicalOffset, err)
			}
		}
		if n := countPrefix(t, s, []byte{prefixPhys}); n != 30 {
			t.Fatalf("%d physical index entries, want 30", n)
		}
		if n := len(getAll(t, s, "Keep", 0, 0)); n != 30 {
			t.Fatalf("Keep lost messages: %d", n)
		}
		if _, ok, _ := s.QueryOffset("g", "Keep", 0); !ok {
			t.Fatal("Keep lost consumer offset")
		}
		if recs, _ := s.QueryByKey("Keep", "k", 100, 0, 1<<62); len(recs) != 30 {
			t.Fatalf("Keep key query finds %d", len(recs))
		}
	}
	check(s)
	must(s.Close())
	s = openTest(t, dir, Options{})
	defer s.Close()
	check(s)
	// Recreated topic restarts at 0 with fresh physical offsets.
	r := mustPut(t, s, msg("Del", 0, "again"))
	if r[0].QueueOffset != 0 || r[0].PhysicalOffset <= delRes[len(delRes)-1].PhysicalOffset {
		t.Fatalf("recreated: %+v", r[0])
	}
	if _, err := s.GetByPhysicalOffset(delRes[0].PhysicalOffset); !errors.Is(err, ErrNotFound) {
		t.Fatalf("old phys resolves to new message: %v", err)
	}
}

func TestReopenPreservesState(t *testing.T) {
	dir := t.TempDir()
	clk := &testClock{}
	clk.ms.Store(5000)
	s := openTest(t, dir, Options{Clock: clk.now})
	var last PutResult
	var lastLen int
	for i := range 50 {
		m := msg(fmt.Sprintf("T%d", i%5), int32(i%4), fmt.Sprint(i))
		last = mustPut(t, s, m)[0]
		lastLen = len(m.Record)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	clk.ms.Store(10) // clock went back across the restart
	s = openTest(t, dir, Options{Clock: clk.now})
	defer s.Close()
	total := 0
	for tp := range 5 {
		for q := range int32(4) {
			total += len(getAll(t, s, fmt.Sprintf("T%d", tp), q, 0))
		}
	}
	if total != 50 {
		t.Fatalf("after reopen: %d messages", total)
	}
	r := mustPut(t, s, msg("T0", 0, "after"))[0]
	if r.PhysicalOffset != last.PhysicalOffset+int64(lastLen) {
		t.Fatalf("physical counter after reopen %d, want %d", r.PhysicalOffset, last.PhysicalOffset+int64(lastLen))
	}
	if r.StoreTimestamp < 5000 {
		t.Fatalf("store timestamp went back after reopen: %d", r.StoreTimestamp)
	}
}

// TestRecoverMetaBehindData writes a message key without updating the queue
// meta or the physical counter (which the store never does) and checks Open
// trusts the data.
func TestRecoverMetaBehindData(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir, Options{})
	mustPut(t, s, msg("M", 0, "a"), msg("M", 0, "b"))
	m := msg("M", 0, "c")
	res := mustPut(t, s, m)[0]
	// Forge offset 3 as a copy of offset 2 at a later physical offset.
	rec := bytes.Clone(m.Record)
	phys := res.PhysicalOffset + int64(len(rec))
	binary.BigEndian.PutUint64(rec[posQueueOffset:], 3)
	binary.BigEndian.PutUint64(rec[posPhysOffset:], uint64(phys))
	hdr, kl := valueHeaderLen(nil)
	v := make([]byte, hdr+len(rec))
	copy(v[putValueHeader(v, 0, res.StoreTimestamp, nil, kl):], rec)
	b := s.db.NewBatch()
	_ = b.Set(appendMsgKey(nil, "M", 0, 3), v, nil)
	pv := binary.BigEndian.AppendUint32(nil, uint32(len(rec)))
	pv = binary.BigEndian.AppendUint32(pv, 0)
	pv = binary.BigEndian.AppendUint64(pv, 3)
	_ = b.Set(appendPhysKey(nil, phys), append(pv, "M"...), nil)
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	_ = b.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, dir, Options{})
	defer s.Close()
	if max, _ := s.MaxOffset("M", 0); max != 4 {
		t.Fatalf("max %d, want 4", max)
	}
	r := mustPut(t, s, msg("M", 0, "d"))[0]
	if r.QueueOffset != 4 || r.PhysicalOffset != phys+int64(len(rec)) {
		t.Fatalf("after recovery: %+v", r)
	}
}

func TestConcurrentPut(t *testing.T) {
	s := openTest(t, t.TempDir(), Options{})
	defer s.Close()
	const workers, per = 16, 60
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := range per {
				msgs := []PutMessage{msg("C", int32(i%4), fmt.Sprintf("%d-%d", w, i))}
				if i%5 == 0 {
					msgs = append(msgs, msg("C", int32(i%4), fmt.Sprintf("%d-%d-b", w, i)))
				}
				res, err := s.Put(context.Background(), msgs)
				if err != nil {
					errs <- err
					return
				}
				for j, r := range res {
					if recQueueOffset(msgs[j].Record) != r.QueueOffset {
						errs <- fmt.Errorf("result/record mismatch")
						return
					}
				}
				if len(res) == 2 && res[1].QueueOffset != res[0].QueueOffset+1 {
					errs <- fmt.Errorf("batch not consecutive: %+v", res)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	phys := map[int64]bool{}
	total := 0
	for q := range int32(4) {
		recs := getAll(t, s, "C", q, 0)
		max, _ := s.MaxOffset("C", q)
		if int64(len(recs)) != max {
			t.Fatalf("queue %d: %d records, max %d", q, len(recs), max)
		}
		for i, r := range recs {
			if recQueueOffset(r) != int64(i) {
				t.Fatalf("queue %d not dense at %d", q, i)
			}
			b := string(recordBody(r))
			if seen[b] || phys[recordPhys(r)] {
				t.Fatalf("duplicate %q", b)
			}
			seen[b], phys[recordPhys(r)] = true, true
		}
		total += len(recs)
	}
	if want := workers * (per + per/5); total != want {
		t.Fatalf("total %d want %d", total, want)
	}
}

func TestGroupCommit(t *testing.T) {
	s := openTest(t, t.TempDir(), Options{FlushMode: FlushSync})
	defer s.Close()
	const workers, per = 32, 30
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for range per {
				if _, err := s.Put(context.Background(), []PutMessage{msg("GC", int32(w%8), "x")}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	puts, syncs := int64(workers*per), s.Syncs()
	t.Logf("%d puts, %d fsyncs (%.1f puts/fsync)", puts, syncs, float64(puts)/float64(syncs))
	if syncs >= puts/2 {
		t.Fatalf("no group commit: %d fsyncs for %d puts", syncs, puts)
	}
	if syncs == 0 {
		t.Fatal("no fsync counted in SYNC mode")
	}
}

func TestAsyncModeAndNotify(t *testing.T) {
	dir := t.TempDir()
	type ev struct {
		topic string
		q     int32
		max   int64
	}
	var mu sync.Mutex
	var evs []ev
	notify := func(topic string, q int32, max int64) {
		mu.Lock()
		evs = append(evs, ev{topic, q, max})
		mu.Unlock()
	}
	s := openTest(t, dir, Options{FlushMode: FlushAsync, SyncInterval: 5 * time.Millisecond, Notify: notify})
	mustPut(t, s, msg("N", 0, "a"), msg("N", 0, "b"), msg("N", 1, "c"))
	if n := len(getAll(t, s, "N", 0, 0)); n != 2 {
		t.Fatalf("async put not readable: %d", n)
	}
	mu.Lock()
	got := slices.Clone(evs)
	mu.Unlock()
	slices.SortFunc(got, func(a, b ev) int { return int(a.q - b.q) })
	if !slices.Equal(got, []ev{{"N", 0, 2}, {"N", 1, 1}}) {
		t.Fatalf("notify events %v", got)
	}
	checkFor(t, 5*time.Second, func() error {
		if s.Syncs() == 0 {
			return errors.New("no background sync")
		}
		return nil
	})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, dir, Options{})
	defer s.Close()
	if max, _ := s.MaxOffset("N", 0); max != 2 {
		t.Fatalf("async data after reopen: max %d", max)
	}
}

func TestClosed(t *testing.T) {
	s := openTest(t, t.TempDir(), Options{})
	// Puts racing with Close either succeed or fail with ErrClosed.
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				_, err := s.Put(context.Background(), []PutMessage{msg("X", 0, "x")})
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	checkFor(t, 5*time.Second, func() error {
		if max, _ := s.MaxOffset("X", 0); max < 20 {
			return errors.New("waiting for puts")
		}
		return nil
	})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if _, err := s.MaxOffset("X", 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("MaxOffset after close: %v", err)
	}
	if _, err := s.Get("X", 0, 0, 1, 0, func([]byte, int64) bool { return true }); !errors.Is(err, ErrClosed) {
		t.Fatalf("Get after close: %v", err)
	}
	if err := s.CommitOffset("g", "X", 0, 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("CommitOffset after close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
}

// TestPutAsync checks PutAsync against Put: results, patched records, one
// callback per call, interleaving with Put in one queue, refusal without a
// callback, and callbacks racing with Close (each succeeds or gets
// ErrClosed; none is lost).
func TestPutAsync(t *testing.T) {
	for _, mode := range []FlushMode{FlushSync, FlushAsync} {
		t.Run(mode.String(), func(t *testing.T) {
			s := openTest(t, t.TempDir(), Options{FlushMode: mode})
			const n = 200
			var wg sync.WaitGroup
			msgs := make([][]PutMessage, n)
			res := make([][]PutResult, n)
			calls := make([]atomic.Int32, n)
			errs := make(chan error, n)
			for i := range n {
				msgs[i] = []PutMessage{msg("A", 0, fmt.Sprintf("a%d", i), fmt.Sprintf("k%d", i))}
				res[i] = make([]PutResult, 1)
				wg.Add(1)
				err := s.PutAsync(context.Background(), msgs[i], res[i], func(err error) {
					if calls[i].Add(1) == 1 {
						errs <- err
						wg.Done()
					}
				})
				if err != nil {
					t.Fatalf("PutAsync %d: %v", i, err)
				}
				if i%10 == 0 {
					mustPut(t, s, msg("A", 0, fmt.Sprintf("p%d", i)))
				}
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatalf("callback error: %v", err)
				}
			}
			for i := range n {
				if c := calls[i].Load(); c != 1 {
					t.Fatalf("callback %d called %d times", i, c)
				}
				if got := recQueueOffset(msgs[i][0].Record); got != res[i][0].QueueOffset {
					t.Fatalf("put %d: record offset %d, result %d", i, got, res[i][0].QueueOffset)
				}
			}
			if got, want := len(getAll(t, s, "A", 0, 0)), n+n/10; got != want {
				t.Fatalf("%d records, want %d", got, want)
			}
			if err := s.PutAsync(context.Background(), msgs[0], nil, func(error) { t.Error("callback of a refused call") }); !errors.Is(err, ErrInvalid) {
				t.Fatalf("PutAsync without result slots: %v", err)
			}

			// Racing with Close.
			var done atomic.Int64
			var submitted int64
			var cw sync.WaitGroup
			cw.Go(func() {
				for {
					r := make([]PutResult, 1)
					err := s.PutAsync(context.Background(), []PutMessage{msg("B", 0, "b")}, r, func(err error) {
						if err != nil && !errors.Is(err, ErrClosed) {
							t.Errorf("callback: %v", err)
						}
						done.Add(1)
					})
					if errors.Is(err, ErrClosed) {
						return
					}
					if err != nil {
						t.Errorf("PutAsync: %v", err)
						return
					}
					submitted++
				}
			})
			checkFor(t, 5*time.Second, func() error {
				if max, _ := s.MaxOffset("B", 0); max < 50 {
					return errors.New("waiting for puts")
				}
				return nil
			})
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			cw.Wait()
			if got := done.Load(); got != submitted {
				t.Fatalf("%d callbacks for %d accepted calls", got, submitted)
			}
		})
	}
}

// TestScanKey: ScanKey visits every record under a key from a store time
// on, oldest first, beyond QueryByKey's cap, after a reopen as well, and
// skips records removed by retention.
func TestScanKey(t *testing.T) {
	clk := &testClock{}
	dir := t.TempDir()
	s := openTest(t, dir, Options{Clock: clk.now})
	n := MaxQueryNum + 10
	for i := range n {
		clk.ms.Store(int64(1000 + i))
		mustPut(t, s, msg("K", 0, fmt.Sprint(i), "dup"), msg("Other", 0, "o", "dup"))
	}
	scan := func(s *Store, begin int64, limit int) []string {
		t.Helper()
		var out []string
		err := s.ScanKey("K", "dup", begin, func(rec []byte) bool {
			out = append(out, string(recordBody(rec)))
			return len(out) < limit
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	got := scan(s, 0, 1<<30)
	if len(got) != n || got[0] != "0" || got[n-1] != fmt.Sprint(n-1) {
		t.Fatalf("scan: %d records, first %q", len(got), got[:1])
	}
	if got := scan(s, int64(1000+n-3), 1<<30); !slices.Equal(got, []string{fmt.Sprint(n - 3), fmt.Sprint(n - 2), fmt.Sprint(n - 1)}) {
		t.Fatalf("from a store time: %v", got)
	}
	if got := scan(s, 0, 2); !slices.Equal(got, []string{"0", "1"}) {
		t.Fatalf("stop: %v", got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, dir, Options{Clock: clk.now})
	defer s.Close()
	if err := s.TruncateBefore("K", 0, 5); err != nil {
		t.Fatal(err)
	}
	if got := scan(s, 0, 1); !slices.Equal(got, []string{"5"}) {
		t.Fatalf("after reopen and truncate: %v", got)
	}
	if err := s.ScanKey("K", "", 0, func([]byte) bool { return true }); !errors.Is(err, ErrInvalid) {
		t.Fatalf("empty key: %v", err)
	}
}
