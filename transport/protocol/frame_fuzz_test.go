package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
)

// fuzzSeeds are frames (without total-length word) every fuzz target starts
// from, besides the committed corpus under testdata/fuzz.
func fuzzSeeds(t interface{ Fatal(...any) }) [][]byte {
	var seeds [][]byte
	for _, c := range []*Command{routeRequest(), benchSendRequest(), benchPullRequest(), {Code: 200050, Remark: "é\x01", Body: []byte("b")}} {
		for _, st := range []SerializeType{SerializeJSON, SerializeRocketMQ} {
			f, err := c.AppendFrame(nil, st)
			if err != nil {
				continue // POP code in binary
			}
			seeds = append(seeds, f[4:])
		}
	}
	seeds = append(seeds,
		jsonFrame(`{"x":{"a":[1,2,{"b":null}]},"extFields":{"n":1.5e3,"t":true,"z":null},"remark":"\ud83d\ude00\u0001"}`),
		jsonFrame(`{"code":1}`+"   "),
		[]byte{2, 0, 0, 0},
		[]byte{1, 0, 0, 21, 0, 1, 9, 1, 0x3d, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
	)
	return seeds
}

// checkFixpoint checks, for a Command decoded from valid input, that encoding
// it in st and decoding again gives the same Command, and that encoding that
// gives the same bytes. Commands st cannot express are skipped.
func checkFixpoint(t *testing.T, d1 *Command, st SerializeType) {
	t.Helper()
	e1, err := d1.AppendFrame(nil, st)
	if err != nil {
		if errors.Is(err, ErrUnencodable) {
			return
		}
		t.Fatalf("encoding a decoded command in %d: %v", st, err)
	}
	d2, err := DecodeFrame(bytes.Clone(e1[4:]))
	if err != nil {
		t.Fatalf("decoding our own encoding %d: %v\n%q", st, err, e1)
	}
	if !commandsEqual(d1, d2) {
		t.Fatalf("not a fixpoint in %d:\n first %s\nsecond %s", st, dumpCommand(d1), dumpCommand(d2))
	}
	e2, err := d2.AppendFrame(nil, st)
	if err != nil || !bytes.Equal(e1, e2) {
		t.Fatalf("re-encoding in %d differs: %v\n%q\n%q", st, err, e1, e2)
	}
}

// chunkReader returns its data in reads of at most n bytes.
type chunkReader struct {
	data []byte
	n    int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	k := min(len(p), r.n, len(r.data))
	copy(p, r.data[:k])
	r.data = r.data[k:]
	return k, nil
}

// FuzzDecodeFrame feeds arbitrary bytes to DecodeFrame, and the same bytes,
// prefixed with their length word and split at an arbitrary point into
// short reads, to ReadFrame.
//
// Invariants: neither panics; every error wraps ErrMalformedFrame; ReadFrame
// agrees with DecodeFrame; for accepted input decode → encode → decode is a
// fixpoint in both header encodings.
func FuzzDecodeFrame(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s, uint16(3))
	}
	f.Fuzz(func(t *testing.T, data []byte, split uint16) {
		d1, err := DecodeFrame(bytes.Clone(data))
		if err != nil {
			if !errors.Is(err, ErrMalformedFrame) {
				t.Fatalf("error does not wrap ErrMalformedFrame: %v", err)
			}
		} else {
			checkFixpoint(t, d1, SerializeJSON)
			checkFixpoint(t, d1, SerializeRocketMQ)
		}

		stream := binary.BigEndian.AppendUint32(nil, uint32(len(data)))
		stream = append(stream, data...)
		cut := int(split) % (len(stream) + 1)
		r := io.MultiReader(&chunkReader{stream[:cut], 1 + int(split)%7}, &chunkReader{stream[cut:], 1 + int(split)%5})
		d2, err2 := ReadFrame(r, 1<<20)
		switch {
		case len(data) < 4 || len(data) > 1<<20:
			if err2 == nil {
				t.Fatalf("ReadFrame accepted a %d-byte frame", len(data))
			}
		case (err == nil) != (err2 == nil):
			t.Fatalf("DecodeFrame: %v, ReadFrame: %v", err, err2)
		case err == nil && !commandsEqual(d1, d2):
			t.Fatalf("DecodeFrame %s, ReadFrame %s", dumpCommand(d1), dumpCommand(d2))
		}
	})
}

// FuzzJSONHeader feeds arbitrary bytes to the JSON header decoder.
//
// Invariants: no panic; every error wraps ErrMalformedFrame; for accepted
// input decode → encode → decode is a fixpoint in both header encodings.
func FuzzJSONHeader(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		if s[0] == byte(SerializeJSON) && len(s) >= 4 {
			f.Add(s[4:])
		}
	}
	f.Fuzz(func(t *testing.T, header []byte) {
		if len(header) > MaxHeaderLength {
			return
		}
		d1, err := DecodeFrame(jsonFrame(string(header)))
		if err != nil {
			if !errors.Is(err, ErrMalformedFrame) {
				t.Fatalf("error does not wrap ErrMalformedFrame: %v", err)
			}
			return
		}
		checkFixpoint(t, d1, SerializeJSON)
		checkFixpoint(t, d1, SerializeRocketMQ)
	})
}

// FuzzBinaryHeader feeds arbitrary bytes to the ROCKETMQ binary header
// decoder.
//
// Invariants: no panic; every error wraps ErrMalformedFrame; for accepted
// input decode → encode → decode is a fixpoint in both header encodings,
// and re-encoding in binary reproduces the input exactly.
func FuzzBinaryHeader(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		if s[0] == byte(SerializeRocketMQ) && len(s) >= 4 {
			f.Add(s[4:])
		}
	}
	f.Fuzz(func(t *testing.T, header []byte) {
		if len(header) > MaxHeaderLength {
			return
		}
		frame := binary.BigEndian.AppendUint32(nil, uint32(SerializeRocketMQ)<<24|uint32(len(header)))
		frame = append(frame, header...)
		d1, err := DecodeFrame(frame)
		if err != nil {
			if !errors.Is(err, ErrMalformedFrame) {
				t.Fatalf("error does not wrap ErrMalformedFrame: %v", err)
			}
			return
		}
		again, err := d1.AppendFrame(nil, SerializeRocketMQ)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again[8:], header) {
			t.Fatalf("binary re-encoding differs:\n got %x\nwant %x", again[8:], header)
		}
		checkFixpoint(t, d1, SerializeJSON)
		checkFixpoint(t, d1, SerializeRocketMQ)
	})
}
