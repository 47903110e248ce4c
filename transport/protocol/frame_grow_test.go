package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"testing"
)

// TestReadFrameClaimedLengthCostsWhatArrives checks that a peer claiming a
// large frame and sending only part of it makes ReadFrame allocate in
// proportion to what it sent, not to the claim.
func TestReadFrameClaimedLengthCostsWhatArrives(t *testing.T) {
	const claim = 8 << 20
	const sent = 100 << 10
	in := make([]byte, 4, 4+sent)
	binary.BigEndian.PutUint32(in, claim)
	in = append(in, make([]byte, sent)...)

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := ReadFrame(bytes.NewReader(in), 16<<20)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("ReadFrame of a cut frame: %v, want io.ErrUnexpectedEOF", err)
	}
	// 64 KiB, then 128 KiB once the first fills: under 512 KiB with slack
	// for the test's own garbage, against the 8 MiB claimed.
	if got := after.TotalAlloc - before.TotalAlloc; got > 512<<10 {
		t.Fatalf("ReadFrame allocated %d bytes for a frame claiming %d of which %d arrived", got, claim, sent)
	}
}

// TestReadFrameLargeInPieces reads frames around and well above the eager
// size, delivered a few bytes at a time, and checks they decode intact.
func TestReadFrameLargeInPieces(t *testing.T) {
	for _, bodyLen := range []int{0, eagerFrameSize - 100, eagerFrameSize, eagerFrameSize + 1, 3*eagerFrameSize + 7, 1 << 20} {
		body := make([]byte, bodyLen)
		for i := range body {
			body[i] = byte(i * 7)
		}
		cmd := &Command{Code: 10, Opaque: 42, Body: body}
		cmd.SetExt("topic", "T")
		frame, err := cmd.AppendFrame(nil, SerializeJSON)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ReadFrame(&chunkReader{data: frame, n: 4093}, 16<<20)
		if err != nil {
			t.Fatalf("body %d: %v", bodyLen, err)
		}
		if got.Code != 10 || got.Opaque != 42 || !bytes.Equal(got.Body, body) {
			t.Fatalf("body %d: decoded code %d opaque %d body %d bytes (equal %v)", bodyLen, got.Code, got.Opaque, len(got.Body), bytes.Equal(got.Body, body))
		}
		if v, _ := got.Ext("topic"); v != "T" {
			t.Fatalf("body %d: topic %q", bodyLen, v)
		}
	}
}
