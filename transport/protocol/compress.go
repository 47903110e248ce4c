package protocol

import (
	"bytes"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
)

// Compression (protocol §4.6). Bodies are RFC 1950 zlib streams.
const (
	// DefaultCompressLevel is the zlib level both reference clients use.
	DefaultCompressLevel = 5
	// CompressBodyOverHowMuch is the body size from which producers compress
	// single messages.
	CompressBodyOverHowMuch = 4096
)

var (
	// ErrCompressionUnsupported reports a compression type other than zlib
	// (LZ4, ZSTD or an unknown type).
	ErrCompressionUnsupported = errors.New("protocol: unsupported compression")
	// ErrDecompressTooLarge reports a body that would decompress to more than
	// the allowed size.
	ErrDecompressTooLarge = errors.New("protocol: decompressed body too large")
	// ErrDecompressCorrupt reports a body that is not a valid zlib stream.
	ErrDecompressCorrupt = errors.New("protocol: corrupt compressed body")
)

// Compress appends the zlib compression of src at level (zlib.BestSpeed..
// zlib.BestCompression, or DefaultCompressLevel) to dst.
func Compress(dst, src []byte, level int) ([]byte, error) {
	buf := bytes.NewBuffer(dst)
	w, err := zlib.NewWriterLevel(buf, level)
	if err != nil {
		return dst, fmt.Errorf("protocol: compress: %w", err)
	}
	if _, err := w.Write(src); err != nil {
		return dst, fmt.Errorf("protocol: compress: %w", err)
	}
	if err := w.Close(); err != nil {
		return dst, fmt.Errorf("protocol: compress: %w", err)
	}
	return buf.Bytes(), nil
}

// Decompress inflates the zlib stream src, producing at most maxSize bytes.
// A stream that would inflate to more yields ErrDecompressTooLarge without
// inflating past maxSize+1 bytes (zip-bomb safe); a damaged stream yields
// ErrDecompressCorrupt.
func Decompress(src []byte, maxSize int) ([]byte, error) {
	if maxSize < 0 {
		maxSize = 0
	}
	zr, err := zlib.NewReader(bytes.NewReader(src))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrDecompressCorrupt, err)
	}
	defer zr.Close()
	// Start with a guess bounded by maxSize; grow as needed.
	initial := min(max(4*len(src), 512), maxSize+1)
	out := make([]byte, 0, initial)
	for {
		if len(out) == cap(out) {
			if len(out) > maxSize {
				return nil, fmt.Errorf("%w: more than %d bytes", ErrDecompressTooLarge, maxSize)
			}
			out = append(out, 0)[:len(out)]
			if cap(out) > maxSize+1 {
				out = out[: len(out) : maxSize+1]
			}
		}
		n, err := zr.Read(out[len(out):cap(out)])
		out = out[:len(out)+n]
		if len(out) > maxSize {
			return nil, fmt.Errorf("%w: more than %d bytes", ErrDecompressTooLarge, maxSize)
		}
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrDecompressCorrupt, err)
		}
	}
}

// DecompressBody returns body as a consumer should see it: unchanged when
// sysFlag lacks SysFlagCompressed, else inflated per the compression type
// bits (0 and 3 are zlib; LZ4 and ZSTD yield ErrCompressionUnsupported),
// producing at most maxSize bytes.
func DecompressBody(sysFlag int32, body []byte, maxSize int) ([]byte, error) {
	if sysFlag&SysFlagCompressed == 0 {
		return body, nil
	}
	switch t := sysFlag & SysFlagCompressionMask; t {
	case 0, SysFlagCompressionZlib:
		return Decompress(body, maxSize)
	case SysFlagCompressionLZ4:
		return nil, fmt.Errorf("%w: LZ4 (sysFlag 0x%X)", ErrCompressionUnsupported, sysFlag)
	case SysFlagCompressionZSTD:
		return nil, fmt.Errorf("%w: ZSTD (sysFlag 0x%X)", ErrCompressionUnsupported, sysFlag)
	default:
		return nil, fmt.Errorf("%w: type %d (sysFlag 0x%X)", ErrCompressionUnsupported, t>>8, sysFlag)
	}
}
