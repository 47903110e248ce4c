package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Batch bodies (SEND_BATCH_MESSAGE request body, protocol §4.4) are a
// concatenation of items: TOTALSIZE int32, MAGICCODE int32 (0), BODYCRC int32
// (0), FLAG int32, body length int32 + body, properties length int16 +
// properties.

// batchItemOverhead is the size of a batch item with empty body and
// properties.
const batchItemOverhead = 4 + 4 + 4 + 4 + 4 + 2

// ErrBatchInvalid reports a malformed batch body or an item that cannot be
// encoded.
var ErrBatchInvalid = errors.New("protocol: invalid batch body")

// BatchItemSize returns the encoded size of one batch item.
func BatchItemSize(body []byte, props string) int {
	return batchItemOverhead + len(body) + len(props)
}

// AppendBatchItem appends one batch item to dst. The error (wrapping
// ErrBatchInvalid) reports properties longer than MaxPropertiesLength or a
// body too large for an int32 size; dst is then returned unchanged. It does
// not allocate when dst has room.
func AppendBatchItem(dst []byte, flag int32, body []byte, props string) ([]byte, error) {
	if len(props) > MaxPropertiesLength {
		return dst, fmt.Errorf("%w: properties length %d exceeds %d", ErrBatchInvalid, len(props), MaxPropertiesLength)
	}
	if len(body) > math.MaxInt32-batchItemOverhead-len(props) {
		return dst, fmt.Errorf("%w: body length %d too large", ErrBatchInvalid, len(body))
	}
	be := binary.BigEndian
	dst = be.AppendUint32(dst, uint32(BatchItemSize(body, props)))
	dst = be.AppendUint32(dst, 0) // MAGICCODE
	dst = be.AppendUint32(dst, 0) // BODYCRC
	dst = be.AppendUint32(dst, uint32(flag))
	dst = be.AppendUint32(dst, uint32(len(body)))
	dst = append(dst, body...)
	dst = be.AppendUint16(dst, uint16(len(props)))
	return append(dst, props...), nil
}

// DecodeBatch decodes the batch body b and calls fn for each item in order;
// an error from fn stops decoding and is returned as is. At most maxItems
// items are accepted (maxItems <= 0 means no count limit beyond the size of
// b). Every item's TOTALSIZE must match its fields; MAGICCODE and BODYCRC are
// ignored, as the Java broker does. body and props alias b. It never panics
// and does not allocate on success. Decoding errors wrap ErrBatchInvalid.
func DecodeBatch(b []byte, maxItems int, fn func(flag int32, body []byte, props string) error) error {
	for i, off := 0, 0; off < len(b); i++ {
		if maxItems > 0 && i >= maxItems {
			return fmt.Errorf("%w: more than %d items", ErrBatchInvalid, maxItems)
		}
		rest := b[off:]
		if len(rest) < batchItemOverhead {
			return fmt.Errorf("%w: item %d truncated: %d bytes left", ErrBatchInvalid, i, len(rest))
		}
		size := int32(binary.BigEndian.Uint32(rest))
		if size < batchItemOverhead || int64(size) > int64(len(rest)) {
			return fmt.Errorf("%w: item %d TOTALSIZE %d outside [%d, %d available]", ErrBatchInvalid, i, size, batchItemOverhead, len(rest))
		}
		r := recReader{b: rest[:size], off: 12}
		flag := int32(r.u32())
		bodyLen := int32(r.u32())
		if bodyLen < 0 {
			return fmt.Errorf("%w: item %d negative body length", ErrBatchInvalid, i)
		}
		body := r.take(int(bodyLen))
		propsLen := int(int16(r.u16()))
		if propsLen < 0 {
			return fmt.Errorf("%w: item %d negative properties length", ErrBatchInvalid, i)
		}
		props := r.take(propsLen)
		if r.bad || r.off != int(size) {
			return fmt.Errorf("%w: item %d lengths (body %d, properties %d) do not match TOTALSIZE %d", ErrBatchInvalid, i, bodyLen, propsLen, size)
		}
		if len(body) == 0 {
			body = nil
		}
		if err := fn(flag, body, msgAlias(props)); err != nil {
			return err
		}
		off += int(size)
	}
	return nil
}
