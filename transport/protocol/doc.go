// Package protocol is runnel's codec for Apache RocketMQ's "remoting" wire
// protocol: frames, the two header encodings (JSON and ROCKETMQ binary),
// request and response codes, typed custom headers and the wire error type.
//
// It is pure data and codecs with no I/O beyond ReadFrame over an io.Reader,
// and it imports nothing else from runnel, so the client and the embedded
// broker share one implementation and cannot disagree on bytes.
//
// # Frames
//
// A frame is a 4-byte big-endian total length (not counting itself), a
// header-length word whose high byte is the header's SerializeType, the
// header, and the body. Command.AppendFrame writes one; ReadFrame reads and
// DecodeFrame decodes one. Decoded commands alias the frame buffer.
//
// # Invariants
//
// Decoders never panic, whatever their input, and check every length against
// the bytes that remain before using it; every decode error wraps
// ErrMalformedFrame. For any input a decoder accepts, encoding the result and
// decoding it again gives the same Command (decode → encode → decode is a
// fixpoint), in either header encoding the Command fits. The fuzz targets in
// this package check both.
package protocol

//go:generate go run ./internal/gen
