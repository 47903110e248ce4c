package protocol

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestBatchGolden(t *testing.T) {
	golden := msgReadHex(t, "testdata/messages/batch_4_4.hex")
	got, err := AppendBatchItem(nil, 0, []byte("ab"), string(AppendProperty(nil, PropTags, "T")))
	if err != nil {
		t.Fatal(err)
	}
	if len(golden) != 31 || !bytes.Equal(got, golden) {
		t.Fatalf("got %x\nwant %x", got, golden)
	}
	var items int
	err = DecodeBatch(golden, 1, func(flag int32, body []byte, props string) error {
		items++
		if flag != 0 || string(body) != "ab" || props != "TAGS\x01T\x02" {
			t.Fatalf("item %d %q %q", flag, body, props)
		}
		return nil
	})
	if err != nil || items != 1 {
		t.Fatalf("items %d err %v", items, err)
	}
}

func TestBatchRoundTrip(t *testing.T) {
	type item struct {
		flag  int32
		body  string
		props string
	}
	in := []item{{1, "", ""}, {-5, "body", "K\x01V\x02"}, {7, strings.Repeat("z", 70000), strings.Repeat("p", MaxPropertiesLength)}}
	var b []byte
	for _, it := range in {
		var err error
		if b, err = AppendBatchItem(b, it.flag, []byte(it.body), it.props); err != nil {
			t.Fatal(err)
		}
	}
	var out []item
	if err := DecodeBatch(b, 0, func(f int32, body []byte, p string) error {
		out = append(out, item{f, string(body), p})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(out) != len(in) {
		t.Fatalf("%d items", len(out))
	}
	for i := range in {
		if in[i] != out[i] {
			t.Fatalf("item %d differs", i)
		}
	}
	// Count limit and callback error.
	if err := DecodeBatch(b, 2, func(int32, []byte, string) error { return nil }); !errors.Is(err, ErrBatchInvalid) {
		t.Fatalf("limit: %v", err)
	}
	stop := errors.New("stop")
	if err := DecodeBatch(b, 0, func(int32, []byte, string) error { return stop }); err != stop {
		t.Fatalf("callback error: %v", err)
	}
	if _, err := AppendBatchItem(nil, 0, nil, strings.Repeat("p", MaxPropertiesLength+1)); !errors.Is(err, ErrBatchInvalid) {
		t.Fatalf("long props: %v", err)
	}
}

func TestBatchDecodeErrors(t *testing.T) {
	golden := msgReadHex(t, "testdata/messages/batch_4_4.hex")
	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte{}, golden...)) }
	cases := map[string][]byte{
		"short":      golden[:20],
		"truncated":  golden[:30],
		"size-small": mut(func(b []byte) []byte { b[3] = 10; return b }),
		"size-large": mut(func(b []byte) []byte { b[3] = 40; return b }),
		"size-neg":   mut(func(b []byte) []byte { b[0] = 0xFF; return b }),
		"body-neg":   mut(func(b []byte) []byte { b[16] = 0x80; return b }),
		"body-long":  mut(func(b []byte) []byte { b[19] = 30; return b }),
		"props-neg":  mut(func(b []byte) []byte { b[22] = 0x80; return b }),
		"props-long": mut(func(b []byte) []byte { b[23] = 8; return b }),
		"trailing":   append(append([]byte{}, golden...), 0, 0, 0),
		"size-mism":  mut(func(b []byte) []byte { b[3] = 32; return append(b, 0) }),
	}
	for name, b := range cases {
		if err := DecodeBatch(b, 0, func(int32, []byte, string) error { return nil }); !errors.Is(err, ErrBatchInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func FuzzDecodeBatch(f *testing.F) {
	f.Add(msgReadHex(f, "testdata/messages/batch_4_4.hex"))
	two, _ := AppendBatchItem(nil, 3, []byte("xyz"), "")
	two, _ = AppendBatchItem(two, 4, nil, "A\x01B\x02")
	f.Add(two)
	f.Fuzz(func(t *testing.T, b []byte) {
		var re []byte
		err := DecodeBatch(b, 1000, func(flag int32, body []byte, props string) error {
			var err error
			re, err = AppendBatchItem(re, flag, body, props)
			return err
		})
		if err != nil {
			return
		}
		// Items re-encode to the input except for MAGICCODE and BODYCRC,
		// which are ignored on decode.
		if len(re) != len(b) {
			t.Fatalf("re-encoded %d bytes of %d", len(re), len(b))
		}
		var n int
		if err := DecodeBatch(re, 0, func(int32, []byte, string) error { n++; return nil }); err != nil {
			t.Fatal(err)
		}
	})
}
