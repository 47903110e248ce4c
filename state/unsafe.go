package state

import "unsafe"

// unsafeSlice views s as bytes; the caller never modifies them.
func unsafeSlice(s string) []byte {
	return unsafe.Slice(unsafe.StringData(s), len(s))
}
