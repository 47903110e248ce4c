package protocol

import (
	"errors"
	"maps"
	"strings"
	"testing"
)

func TestPropertiesJavaRules(t *testing.T) {
	raw := "A\x011\x02\x01x\x02B\x01\x02C\x01a\x01b\x02xx\x02\x02D\x01last"
	want := map[string]string{"A": "1", "C": "a\x01b", "D": "last"}
	if got := ParseProperties(raw); !maps.Equal(got, want) {
		t.Fatalf("ParseProperties = %q, want %q", got, want)
	}
	for k, v := range want {
		if got, ok := PropertyValue(raw, k); !ok || got != v {
			t.Errorf("PropertyValue(%q) = %q %v", k, got, ok)
		}
	}
	for _, k := range []string{"B", "", "x", "xx", "AB", "a"} {
		if v, ok := PropertyValue(raw, k); ok {
			t.Errorf("PropertyValue(%q) = %q, want absent", k, v)
		}
	}
	// Last duplicate wins, as in Java's map.put.
	if v, _ := PropertyValue("K\x011\x02K\x012\x02", "K"); v != "2" {
		t.Fatalf("duplicate: %q", v)
	}
	// A key that is a prefix of another key.
	if v, ok := PropertyValue("TAGSX\x01no\x02TAGS\x01yes\x02", "TAGS"); !ok || v != "yes" {
		t.Fatalf("prefix: %q", v)
	}
}

func TestPropertiesEncode(t *testing.T) {
	b := AppendProperty(nil, PropTags, "T")
	if string(b) != "TAGS\x01T\x02" {
		t.Fatalf("%q", b)
	}
	m := map[string]string{"b": "2", "a": "1", "": "x", "e": ""}
	if got := string(AppendProperties(nil, m)); got != "a\x011\x02b\x012\x02" {
		t.Fatalf("%q", got)
	}
	if got := string(AppendPropertiesExcept(nil, "a\x011\x02b\x012\x02c\x013", "b")); got != "a\x011\x02c\x013\x02" {
		t.Fatalf("%q", got)
	}
	var n []string
	RangeProperties("a\x011\x02b\x012\x02c\x013", func(k, v string) bool { n = append(n, k+v); return len(n) < 2 })
	if strings.Join(n, ",") != "a1,b2" {
		t.Fatalf("range: %v", n)
	}
}

func TestPropertiesValidate(t *testing.T) {
	for _, kv := range [][2]string{{"", "v"}, {"k", ""}, {"k\x01", "v"}, {"k", "v\x02"}} {
		if err := ValidateProperty(kv[0], kv[1]); !errors.Is(err, ErrPropertiesInvalid) {
			t.Errorf("%q: %v", kv, err)
		}
	}
	if err := ValidateProperty("k", "v"); err != nil {
		t.Fatal(err)
	}
	if err := ValidateProperties(strings.Repeat("x", MaxPropertiesLength)); err != nil {
		t.Fatal(err)
	}
	if err := ValidateProperties(strings.Repeat("x", MaxPropertiesLength+1)); !errors.Is(err, ErrPropertiesInvalid) {
		t.Fatal(err)
	}
}

func TestTagsHashCode(t *testing.T) {
	// Values of Java's String.hashCode.
	cases := map[string]int64{
		"":      0,
		"TagA":  2598919,
		"TagB":  2598920,
		"hello": 99162322,
		// Overflow wraps as int32 and sign-extends.
		"abcdefghijklmnop": -2093879032,
		// Non-ASCII: Java hashes UTF-16 units ("é" = 0xE9; "😀" = D83D DE00).
		"é": 0xE9,
		"😀": 1772899, // 0xD83D*31 + 0xDE00
	}
	for s, want := range cases {
		if got := TagsHashCode(s); got != want {
			t.Errorf("TagsHashCode(%q) = %d, want %d", s, got, want)
		}
	}
	if TagsHashCodeUTF8("TagA") != 2598919 || TagsHashCodeUTF8("é") == TagsHashCode("é") {
		t.Fatal("UTF-8 variant")
	}
}

func TestParseTagExpression(t *testing.T) {
	for _, e := range []string{"", "*", "  *  "} {
		if f := ParseTagExpression(e); !f.All || !f.Match("x") {
			t.Errorf("%q should match all", e)
		}
	}
	f := ParseTagExpression(" TagA || TagB||TagA ||  ")
	if f.All || len(f.Tags) != 2 || f.Tags[0] != "TagA" || f.Tags[1] != "TagB" {
		t.Fatalf("%+v", f)
	}
	if !f.Match("TagB") || f.Match("TagC") || f.Match("") {
		t.Fatal("match")
	}
	if c := f.Codes(); c[0] != 2598919 || c[1] != 2598920 {
		t.Fatal(c)
	}
	if f := ParseTagExpression("||"); f.All || f.Match("x") {
		t.Fatal("|| matches nothing")
	}
}

func FuzzProperties(f *testing.F) {
	f.Add("TAGS\x01TagA\x02UNIQ_KEY\x01X\x02", "TAGS")
	f.Add("\x01\x02\x01\x01\x02a\x01", "a")
	f.Add("k\x01v", "k")
	f.Fuzz(func(t *testing.T, raw, key string) {
		m := ParseProperties(raw)
		v, ok := PropertyValue(raw, key)
		if mv, mok := m[key]; mv != v || mok != ok {
			t.Fatalf("PropertyValue(%q)=%q,%v; map has %q,%v", key, v, ok, mv, mok)
		}
		// Canonical re-encoding parses to the same map, when the map is
		// encodable (names without \x01, values without \x02 - guaranteed by
		// the parser).
		if got := ParseProperties(string(AppendProperties(nil, m))); !maps.Equal(got, m) {
			t.Fatalf("round trip %q -> %q", m, got)
		}
		_ = ValidateProperties(raw)
		TagsHashCode(raw)
		ParseTagExpression(raw).Codes()
	})
}

func BenchmarkProperties(b *testing.B) {
	m := a1Message()
	props := m.Properties + "KEYS\x01order-1 order-2\x02MAX_OFFSET\x0110000\x02MIN_OFFSET\x010\x02"
	b.Run("lookup-first", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if v, ok := PropertyValue(props, PropTags); !ok || v != "TagA" {
				b.Fatal(v)
			}
		}
	})
	b.Run("lookup-last", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := PropertyValue(props, PropMinOffset); !ok {
				b.Fatal("missing")
			}
		}
	})
	b.Run("lookup-absent", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := PropertyValue(props, PropDelayLevel); ok {
				b.Fatal("present")
			}
		}
	})
	b.Run("append3", func(b *testing.B) {
		buf := make([]byte, 0, 256)
		b.ReportAllocs()
		for b.Loop() {
			buf = AppendProperty(buf[:0], PropTags, "TagA")
			buf = AppendProperty(buf, PropUniqKey, "0A0000090001000000000000DEAD0001")
			buf = AppendProperty(buf, PropKeys, "k")
		}
	})
}

// BenchmarkPropertyValue looks up properties in the string an exactly-once
// sink's message carries (keys, lineage, transaction and producer group,
// unique key), as the broker does several times per message it stores.
func BenchmarkPropertyValue(b *testing.B) {
	raw := string(AppendProperties(nil, map[string]string{
		PropKeys:                "order-000123456",
		PropTags:                "valid",
		PropUniqKey:             "7F0000010D2C1B2F3A4C5D6E7F801234",
		PropTransactionPrepared: "true",
		PropProducerGroup:       "runnel-tx-etl-orders-sink",
		PropWaitStoreMsgOK:      "true",
		"runnel.src":            "orders@broker-a:3",
		"runnel.off":            "123456",
		"runnel.op":             "sink",
		"runnel.epoch":          "42",
		"runnel.task":           "sink/3",
		PropBornTimestamp:       "1796191254848",
	}))
	for _, key := range []string{PropTags, PropUniqKey, PropDelayLevel} {
		b.Run(key, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				PropertyValue(raw, key)
			}
		})
	}
}
