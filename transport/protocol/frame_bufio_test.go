package protocol

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"testing"
)

// TestReadFrameBufioLengthWord checks the peeking length-word path of a
// *bufio.Reader against the plain io.Reader path: clean EOF, EOF inside the
// length word, a frame split across reads, and no allocation beyond the
// frame buffer and the Command.
func TestReadFrameBufioLengthWord(t *testing.T) {
	frame, err := NewRequest(ReqSendMessage).AppendFrame(nil, SerializeJSON)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, io.EOF},
		{"partial length word", frame[:2], io.ErrUnexpectedEOF},
		{"partial frame", frame[:len(frame)-1], io.ErrUnexpectedEOF},
	} {
		for _, wrap := range []struct {
			name string
			r    func([]byte) io.Reader
		}{
			{"bufio", func(b []byte) io.Reader { return bufio.NewReader(bytes.NewReader(b)) }},
			{"plain", func(b []byte) io.Reader { return bytes.NewReader(b) }},
		} {
			_, err := ReadFrame(wrap.r(tc.in), 0)
			if !errors.Is(err, tc.want) || (tc.want == io.EOF && err != io.EOF) {
				t.Errorf("%s/%s: err %v, want %v", tc.name, wrap.name, err, tc.want)
			}
		}
	}
	// Split delivery: one byte per Read.
	br := bufio.NewReaderSize(&oneByteReader{b: append(append([]byte(nil), frame...), frame...)}, 16)
	for i := range 2 {
		c, err := ReadFrame(br, 0)
		if err != nil || c.Code != ReqSendMessage {
			t.Fatalf("frame %d: %v %+v", i, err, c)
		}
	}
	if _, err := ReadFrame(br, 0); err != io.EOF {
		t.Fatalf("after the last frame: %v, want io.EOF", err)
	}
	src := bytes.NewReader(nil)
	br = bufio.NewReader(src)
	if n := testing.AllocsPerRun(100, func() {
		src.Reset(frame)
		br.Reset(src)
		if _, err := ReadFrame(br, 0); err != nil {
			t.Fatal(err)
		}
	}); n > 2 {
		t.Fatalf("%v allocations per frame, want <= 2 (buffer, Command)", n)
	}
}

type oneByteReader struct{ b []byte }

func (r *oneByteReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	p[0] = r.b[0]
	r.b = r.b[1:]
	return 1, nil
}
