package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// # HA frames
//
// A master broker streams its log to its slaves over a plain TCP connection
// of its own (the HA port), not over remoting frames. The layout is that of
// Apache RocketMQ 5's AutoSwitchHAConnection and AutoSwitchHAClient: every
// frame starts with the connection state (an HAConnectionState ordinal,
// int32), the master's frames then with the body size; all integers are
// big-endian.
//
//	slave → master
//	  HANDSHAKE  state(4)=1  flags(4)  slaveBrokerId(8) | bodySize(4)  body = identity
//	  TRANSFER   state(4)=2  maxOffset(8)                          (the slave's log end: its ack)
//	master → slave
//	  HANDSHAKE  state(4)=1  bodySize(4)  maxOffset(8)  epoch(4) | body = identity, epoch entries
//	  TRANSFER   state(4)=2  bodySize(4)  offset(8)  epoch(4)  epochStartOffset(8)  confirmOffset(8) | body = log entries
//	  SHUTDOWN   state(4)=4  bodySize(4)  offset(8)=0  epoch(4)=0 | body = the reason (UTF-8): a refusal
//
// A TRANSFER frame's body holds whole log entries starting at offset (the
// physical offset of the first entry's record); a body of size 0 is a
// heartbeat. The parts RocketMQ does not have, runnel's additions: the
// slave's HANDSHAKE carries a body (the identity: cluster, broker name, the
// broker address and the log id, each a uint16-length string) after its 16
// fixed bytes, so that a master refuses a slave of another broker name or
// cluster, or one holding another master's log; the master's HANDSHAKE body
// starts with the same identity, then a uint32 count of epoch entries
// (epoch int32, startOffset int64: 12 bytes each, as in AutoSwitch); the
// SHUTDOWN frame is how a master refuses a slave (with the reason) before it
// closes the connection. A TRANSFER body entry is the stored record (§4.1,
// the bytes of RocketMQ's commit log for that message, TOTALSIZE first)
// followed by what the slave's consume queue and key index are rebuilt from:
// tagsCode(8) keyCount(2) { keyLen(2) key }. (A Java slave computes both
// from the record; a runnel master sends them because some of its index
// keys, such as a transaction commit's, are not derivable from the record
// alone.)

// HA connection states (Java HAConnectionState ordinals), the first word of
// every HA frame.
const (
	HAStateReady     int32 = 0
	HAStateHandshake int32 = 1
	HAStateTransfer  int32 = 2
	HAStateSuspend   int32 = 3
	HAStateShutdown  int32 = 4
)

// Sizes of the fixed parts of HA frames.
const (
	// HASlaveHandshakeLen is the fixed part of a slave's HANDSHAKE
	// (AutoSwitchHAClient.HANDSHAKE_HEADER_SIZE), before runnel's bodySize
	// word.
	HASlaveHandshakeLen = 4 + 4 + 8
	// HASlaveReportLen is a slave's TRANSFER report
	// (AutoSwitchHAClient.TRANSFER_HEADER_SIZE).
	HASlaveReportLen = 4 + 8
	// HAMasterHeaderLen is the header of a master's HANDSHAKE or SHUTDOWN
	// frame (AutoSwitchHAConnection.HANDSHAKE_HEADER_SIZE).
	HAMasterHeaderLen = 4 + 4 + 8 + 4
	// HATransferHeaderLen is the header of a master's TRANSFER frame
	// (AutoSwitchHAConnection.TRANSFER_HEADER_SIZE).
	HATransferHeaderLen = HAMasterHeaderLen + 8 + 8
	// HAEpochEntryLen is one epoch entry (AutoSwitchHAConnection.EPOCH_ENTRY_SIZE).
	HAEpochEntryLen = 12
	// DefaultHAMaxBody bounds an HA frame body unless told otherwise.
	DefaultHAMaxBody = 16 << 20
	// maxHAEpochs bounds the epoch entries of one handshake.
	maxHAEpochs = 1 << 16
	// MaxHAKeys bounds the index keys of one log entry.
	MaxHAKeys = math.MaxUint16
)

// ErrMalformedHAFrame is wrapped by every HA frame decoding error.
var ErrMalformedHAFrame = errors.New("protocol: malformed HA frame")

func badHA(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformedHAFrame, fmt.Sprintf(format, args...))
}

// HAIdentity names the broker at one end of an HA connection: its cluster
// and broker name (which must be the same at both ends), the address
// clients reach it at (a slave learns its master's from it), and the id of
// the log it holds ("" for an empty log), which a master and its slave must
// share.
type HAIdentity struct {
	Cluster    string
	BrokerName string
	BrokerAddr string
	LogID      string
}

// HAEpoch is one epoch of a master's log: the log from StartOffset up to
// the next epoch's start was written by one run of the master (Java
// EpochEntry).
type HAEpoch struct {
	Epoch       int32
	StartOffset int64
}

// HASlaveFrame is a decoded slave → master frame: a HANDSHAKE (BrokerID,
// Flags, Identity) or a TRANSFER report (MaxOffset).
type HASlaveFrame struct {
	State     int32
	Flags     int32
	BrokerID  int64
	Identity  HAIdentity
	MaxOffset int64
}

// HAMasterFrame is a decoded master → slave frame. Body aliases the read
// buffer. For a HANDSHAKE, Offset is the master's log end and Body holds
// the identity and epochs (DecodeHAMasterHandshake); for a TRANSFER, Offset
// is the physical offset of the first log entry of Body; for a SHUTDOWN,
// Body is the reason.
type HAMasterFrame struct {
	State            int32
	Offset           int64
	Epoch            int32
	EpochStartOffset int64
	ConfirmOffset    int64
	Body             []byte
}

func appendHAString(dst []byte, s string) ([]byte, error) {
	if len(s) > math.MaxUint16 {
		return dst, fmt.Errorf("%w: HA string of %d bytes", ErrUnencodable, len(s))
	}
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(s)))
	return append(dst, s...), nil
}

func (id *HAIdentity) appendTo(dst []byte) ([]byte, error) {
	var err error
	for _, s := range [...]string{id.Cluster, id.BrokerName, id.BrokerAddr, id.LogID} {
		if dst, err = appendHAString(dst, s); err != nil {
			return dst, err
		}
	}
	return dst, nil
}

// haReader reads big-endian values from a body with a sticky error.
type haReader struct {
	b   []byte
	bad bool
}

func (r *haReader) take(n int) []byte {
	if r.bad || n < 0 || n > len(r.b) {
		r.bad = true
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *haReader) u16() uint16 {
	if v := r.take(2); v != nil {
		return binary.BigEndian.Uint16(v)
	}
	return 0
}

func (r *haReader) u32() uint32 {
	if v := r.take(4); v != nil {
		return binary.BigEndian.Uint32(v)
	}
	return 0
}

func (r *haReader) u64() uint64 {
	if v := r.take(8); v != nil {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

func (r *haReader) str() string { return string(r.take(int(r.u16()))) }

func (r *haReader) identity() HAIdentity {
	return HAIdentity{Cluster: r.str(), BrokerName: r.str(), BrokerAddr: r.str(), LogID: r.str()}
}

// AppendHASlaveHandshake appends a slave's HANDSHAKE frame.
func AppendHASlaveHandshake(dst []byte, brokerID int64, id HAIdentity) ([]byte, error) {
	dst = binary.BigEndian.AppendUint32(dst, uint32(HAStateHandshake))
	dst = binary.BigEndian.AppendUint32(dst, 0) // isSyncFromLastFile=0, isAsyncLearner=0
	dst = binary.BigEndian.AppendUint64(dst, uint64(brokerID))
	at := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst, err := id.appendTo(dst)
	if err != nil {
		return dst, err
	}
	binary.BigEndian.PutUint32(dst[at:], uint32(len(dst)-at-4))
	return dst, nil
}

// AppendHASlaveReport appends a slave's TRANSFER report of its log end.
func AppendHASlaveReport(dst []byte, maxOffset int64) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(HAStateTransfer))
	return binary.BigEndian.AppendUint64(dst, uint64(maxOffset))
}

// ReadHASlaveFrame reads one slave → master frame from r. A HANDSHAKE body
// larger than maxBody (DefaultHAMaxBody when <= 0), an unknown state or a
// short read is an error; a malformed frame's error wraps
// ErrMalformedHAFrame, a failed read's wraps the reader's error
// (io.ErrUnexpectedEOF within a frame, io.EOF before one).
func ReadHASlaveFrame(r io.Reader, maxBody int) (HASlaveFrame, error) {
	if maxBody <= 0 {
		maxBody = DefaultHAMaxBody
	}
	var hdr [HASlaveHandshakeLen + 4]byte
	if _, err := io.ReadFull(r, hdr[:4]); err != nil {
		return HASlaveFrame{}, err
	}
	f := HASlaveFrame{State: int32(binary.BigEndian.Uint32(hdr[:4]))}
	switch f.State {
	case HAStateTransfer:
		if _, err := io.ReadFull(r, hdr[4:HASlaveReportLen]); err != nil {
			return f, unexpected(err)
		}
		f.MaxOffset = int64(binary.BigEndian.Uint64(hdr[4:]))
		if f.MaxOffset < 0 {
			return f, badHA("negative slave offset %d", f.MaxOffset)
		}
		return f, nil
	case HAStateHandshake:
		if _, err := io.ReadFull(r, hdr[4:]); err != nil {
			return f, unexpected(err)
		}
		f.Flags = int32(binary.BigEndian.Uint32(hdr[4:]))
		f.BrokerID = int64(binary.BigEndian.Uint64(hdr[8:]))
		n := int64(binary.BigEndian.Uint32(hdr[16:]))
		if n > int64(maxBody) {
			return f, badHA("handshake body of %d bytes exceeds %d", n, maxBody)
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			return f, unexpected(err)
		}
		rd := haReader{b: body}
		f.Identity = rd.identity()
		if rd.bad || len(rd.b) != 0 {
			return f, badHA("slave handshake body of %d bytes does not hold an identity", n)
		}
		return f, nil
	default:
		return f, badHA("slave frame with state %d", f.State)
	}
}

// unexpected turns an EOF inside a frame into io.ErrUnexpectedEOF.
func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

func appendHAMasterHeader(dst []byte, state int32, bodySize int, offset int64, epoch int32) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(state))
	dst = binary.BigEndian.AppendUint32(dst, uint32(bodySize))
	dst = binary.BigEndian.AppendUint64(dst, uint64(offset))
	return binary.BigEndian.AppendUint32(dst, uint32(epoch))
}

// AppendHAMasterHandshake appends a master's HANDSHAKE frame: its log end,
// its current epoch, its identity and its epoch entries (ascending).
func AppendHAMasterHandshake(dst []byte, maxOffset int64, epoch int32, id HAIdentity, epochs []HAEpoch) ([]byte, error) {
	if len(epochs) > maxHAEpochs {
		return dst, fmt.Errorf("%w: %d epoch entries", ErrUnencodable, len(epochs))
	}
	at := len(dst)
	dst = appendHAMasterHeader(dst, HAStateHandshake, 0, maxOffset, epoch)
	dst, err := id.appendTo(dst)
	if err != nil {
		return dst, err
	}
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(epochs)))
	for _, e := range epochs {
		dst = binary.BigEndian.AppendUint32(dst, uint32(e.Epoch))
		dst = binary.BigEndian.AppendUint64(dst, uint64(e.StartOffset))
	}
	binary.BigEndian.PutUint32(dst[at+4:], uint32(len(dst)-at-HAMasterHeaderLen))
	return dst, nil
}

// DecodeHAMasterHandshake decodes the body of a master's HANDSHAKE.
func DecodeHAMasterHandshake(body []byte) (HAIdentity, []HAEpoch, error) {
	r := haReader{b: body}
	id := r.identity()
	n := int(r.u32())
	if r.bad || n > maxHAEpochs || n*HAEpochEntryLen != len(r.b) {
		return id, nil, badHA("master handshake body of %d bytes: bad identity or epoch list", len(body))
	}
	epochs := make([]HAEpoch, n)
	for i := range epochs {
		epochs[i] = HAEpoch{Epoch: int32(r.u32()), StartOffset: int64(r.u64())}
		if epochs[i].StartOffset < 0 || (i > 0 && (epochs[i].Epoch <= epochs[i-1].Epoch || epochs[i].StartOffset < epochs[i-1].StartOffset)) {
			return id, nil, badHA("epoch entries not ascending at %d", i)
		}
	}
	return id, epochs, nil
}

// AppendHARefusal appends a master's SHUTDOWN frame carrying why it refuses
// the slave.
func AppendHARefusal(dst []byte, reason string) []byte {
	dst = appendHAMasterHeader(dst, HAStateShutdown, len(reason), 0, 0)
	return append(dst, reason...)
}

// AppendHATransferHeader appends the header of a master's TRANSFER frame
// whose body (bodySize bytes of log entries, 0 for a heartbeat) the caller
// appends or writes next.
func AppendHATransferHeader(dst []byte, bodySize int, offset int64, epoch int32, epochStart, confirm int64) []byte {
	dst = appendHAMasterHeader(dst, HAStateTransfer, bodySize, offset, epoch)
	dst = binary.BigEndian.AppendUint64(dst, uint64(epochStart))
	return binary.BigEndian.AppendUint64(dst, uint64(confirm))
}

// ReadHAMasterFrame reads one master → slave frame from r into buf (grown
// as needed; the frame's Body aliases the returned buffer). A body larger
// than maxBody (DefaultHAMaxBody when <= 0), a negative offset or an
// unknown state is an error wrapping ErrMalformedHAFrame.
func ReadHAMasterFrame(r io.Reader, buf []byte, maxBody int) (HAMasterFrame, []byte, error) {
	if maxBody <= 0 {
		maxBody = DefaultHAMaxBody
	}
	var hdr [HATransferHeaderLen]byte
	if _, err := io.ReadFull(r, hdr[:HAMasterHeaderLen]); err != nil {
		return HAMasterFrame{}, buf, err
	}
	f := HAMasterFrame{
		State:  int32(binary.BigEndian.Uint32(hdr[0:])),
		Offset: int64(binary.BigEndian.Uint64(hdr[8:])),
		Epoch:  int32(binary.BigEndian.Uint32(hdr[16:])),
	}
	size := int64(int32(binary.BigEndian.Uint32(hdr[4:])))
	switch f.State {
	case HAStateHandshake, HAStateShutdown:
	case HAStateTransfer:
		if _, err := io.ReadFull(r, hdr[HAMasterHeaderLen:]); err != nil {
			return f, buf, unexpected(err)
		}
		f.EpochStartOffset = int64(binary.BigEndian.Uint64(hdr[20:]))
		f.ConfirmOffset = int64(binary.BigEndian.Uint64(hdr[28:]))
	default:
		return f, buf, badHA("master frame with state %d", f.State)
	}
	if size < 0 || size > int64(maxBody) {
		return f, buf, badHA("body of %d bytes outside [0, %d]", size, maxBody)
	}
	if f.Offset < 0 || f.EpochStartOffset < 0 || f.ConfirmOffset < 0 {
		return f, buf, badHA("negative offset in a master frame")
	}
	if cap(buf) < int(size) {
		buf = make([]byte, size)
	}
	buf = buf[:size]
	if _, err := io.ReadFull(r, buf); err != nil {
		return f, buf, unexpected(err)
	}
	f.Body = buf
	return f, buf, nil
}

// HALogEntry is one entry of a TRANSFER body: a stored record with the tags
// code and index keys of its consume queue and key index entries. Record
// and Keys alias the body they were decoded from (Keys' strings are
// copies).
type HALogEntry struct {
	Record   []byte
	TagsCode int64
	Keys     []string
}

// AppendHALogEntry appends one log entry to a TRANSFER body.
func AppendHALogEntry(dst, record []byte, tagsCode int64, keys []string) ([]byte, error) {
	dst, err := AppendHALogEntryStart(dst, record, tagsCode, len(keys))
	for _, k := range keys {
		if err != nil {
			break
		}
		dst, err = appendHAString(dst, k)
	}
	return dst, err
}

// AppendHALogEntryStart appends a log entry's record, tags code and key
// count; the caller appends exactly nKeys keys with AppendHALogKey next.
func AppendHALogEntryStart(dst, record []byte, tagsCode int64, nKeys int) ([]byte, error) {
	if nKeys < 0 || nKeys > MaxHAKeys {
		return dst, fmt.Errorf("%w: %d index keys", ErrUnencodable, nKeys)
	}
	if len(record) < 4 || int(binary.BigEndian.Uint32(record)) != len(record) {
		return dst, fmt.Errorf("%w: record TOTALSIZE does not match its %d bytes", ErrUnencodable, len(record))
	}
	dst = append(dst, record...)
	dst = binary.BigEndian.AppendUint64(dst, uint64(tagsCode))
	return binary.BigEndian.AppendUint16(dst, uint16(nKeys)), nil
}

// AppendHALogKey appends one index key of the log entry started last.
func AppendHALogKey(dst, key []byte) ([]byte, error) {
	if len(key) > math.MaxUint16 {
		return dst, fmt.Errorf("%w: index key of %d bytes", ErrUnencodable, len(key))
	}
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(key)))
	return append(dst, key...), nil
}

// DecodeHALogEntries calls fn for each log entry of a TRANSFER body, in
// order, stopping at fn's first error, which it returns. An entry whose
// record is not a valid stored record (DecodeRecord) or whose lengths run
// past the body is an error wrapping ErrMalformedHAFrame; entries before it
// were delivered. keys is scratch space for the entries' keys (the slice
// passed to fn is reused for the next entry).
func DecodeHALogEntries(body []byte, keys []string, fn func(e *HALogEntry) error) error {
	var e HALogEntry
	for off := 0; off < len(body); {
		_, n, err := DecodeRecord(body[off:])
		if err != nil {
			return fmt.Errorf("%w: log entry at byte %d: %w", ErrMalformedHAFrame, off, err)
		}
		e.Record = body[off : off+n : off+n]
		off += n
		r := haReader{b: body[off:]}
		e.TagsCode = int64(r.u64())
		nk := int(r.u16())
		keys = keys[:0]
		for range nk {
			if k := r.str(); !r.bad {
				keys = append(keys, k)
			}
		}
		if r.bad {
			return badHA("log entry at byte %d: dispatch data runs past the body", off)
		}
		off = len(body) - len(r.b)
		e.Keys = keys
		if err := fn(&e); err != nil {
			return err
		}
	}
	return nil
}
