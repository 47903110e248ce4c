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
// # Header encodings
//
// SerializeRocketMQ is Java's compact binary header (fixed 21 bytes, then the
// remark and the extFields map); it holds code and version as int16, so
// codes above 32767 (the POP family) need SerializeJSON. SerializeJSON is
// written compact, in rocketmq-client-go's member order, without reflection;
// its decoder accepts Java's and Go's output (any member order, unknown
// members, numbers or booleans as extFields values) and unescapes strings in
// place. Each frame may use either encoding; receivers look at every frame.
//
// # Codes and headers
//
// definitions/codes.def and definitions/headers.def are the single source of
// the Req* and Res* constants, RequestCodeName and ResponseCodeName, and the
// typed custom headers (SendMessageRequestHeader, PullMessageRequestHeader,
// …), each with Encode(*Command) and Decode(*Command) error. go generate
// writes them to zz_generated.go; a test fails when that file is stale.
// Required fields are plain values; optional numbers and booleans are Opt
// values so that absent is not zero; optional strings are absent when empty.
//
// # Errors
//
// A non-success response becomes an *Error (ResponseError) whose Is matches
// by code, so errors.Is(err, ErrTopicNotExist) works on any broker reply;
// IsRetryable classifies codes worth retrying elsewhere.
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
