package protocol

import (
	"bytes"
	"errors"
	"testing"
)

func TestCompressRoundTrip(t *testing.T) {
	for _, n := range []int{0, 1, 4096, 1 << 20} {
		src := bytes.Repeat([]byte("abcdefgh"), n/8+1)[:n]
		z, err := Compress([]byte("pre"), src, DefaultCompressLevel)
		if err != nil || !bytes.HasPrefix(z, []byte("pre")) {
			t.Fatal(err)
		}
		z = z[3:]
		if z[0] != 0x78 {
			t.Fatalf("not a zlib header: %x", z[:2])
		}
		got, err := Decompress(z, n)
		if err != nil || !bytes.Equal(got, src) {
			t.Fatalf("n=%d: %v", n, err)
		}
		if n > 0 {
			if _, err := Decompress(z, n-1); !errors.Is(err, ErrDecompressTooLarge) {
				t.Fatalf("n=%d bound: %v", n, err)
			}
		}
	}
	if _, err := Compress(nil, nil, 42); err == nil {
		t.Fatal("bad level accepted")
	}
}

func TestDecompressBodyTypes(t *testing.T) {
	z, _ := Compress(nil, []byte("hello"), DefaultCompressLevel)
	for _, f := range []int32{SysFlagCompressed, SysFlagCompressed | SysFlagCompressionZlib} {
		if got, err := DecompressBody(f, z, 100); err != nil || string(got) != "hello" {
			t.Fatalf("flag %x: %q %v", f, got, err)
		}
	}
	if got, err := DecompressBody(0, z, 1); err != nil || !bytes.Equal(got, z) {
		t.Fatal("uncompressed body must be returned as is")
	}
	for _, f := range []int32{SysFlagCompressionLZ4, SysFlagCompressionZSTD, 0x400} {
		if _, err := DecompressBody(SysFlagCompressed|f, z, 100); !errors.Is(err, ErrCompressionUnsupported) {
			t.Fatalf("flag %x: %v", f, err)
		}
	}
	for _, bad := range [][]byte{nil, {0x78}, z[:len(z)-2], append([]byte{0x78, 0x9c}, 0xFF, 0xFF)} {
		if _, err := Decompress(bad, 100); !errors.Is(err, ErrDecompressCorrupt) {
			t.Fatalf("%x: %v", bad, err)
		}
	}
}

func TestDecompressBomb(t *testing.T) {
	z, _ := Compress(nil, make([]byte, 4<<20), 9) // 4 MiB of zeros, ~4 KiB compressed
	if _, err := Decompress(z, 256<<10); !errors.Is(err, ErrDecompressTooLarge) {
		t.Fatal(err)
	}
}

func FuzzDecompress(f *testing.F) {
	z, _ := Compress(nil, []byte("hello hello hello"), DefaultCompressLevel)
	f.Add(z)
	f.Add([]byte{0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		const limit = 1 << 16
		out, err := Decompress(b, limit)
		if err == nil && len(out) > limit {
			t.Fatalf("%d bytes exceed the bound", len(out))
		}
	})
}
