package protocol

import "testing"

func TestSetExtBytesCopiesIntoArena(t *testing.T) {
	c := NewRequest(1)
	buf := []byte("0A00000100002A9F0000000000000010")
	c.SetExtInt("queueOffset", 123456)
	c.SetExtBytes("msgId", buf)
	buf[0] = 'X' // the field holds a copy
	if v, _ := c.Ext("msgId"); v != "0A00000100002A9F0000000000000010" {
		t.Fatalf("msgId = %q", v)
	}
	if v, _ := c.Ext("queueOffset"); v != "123456" {
		t.Fatalf("queueOffset = %q", v)
	}
	c.SetExtBytes("msgId", []byte("AB"))
	c.SetExtBytes("big", make([]byte, 300))
	if v, _ := c.Ext("msgId"); v != "AB" || c.NumExt() != 3 {
		t.Fatalf("after replace: msgId %q, %d fields", v, c.NumExt())
	}
	if v, _ := c.Ext("big"); len(v) != 300 {
		t.Fatalf("big = %d bytes", len(v))
	}
	if n := testing.AllocsPerRun(100, func() {
		r := NewResponse(c, 0, "")
		r.SetExtInt("queueOffset", 123456)
		r.SetExtBytes("msgId", buf)
	}); n > 2 {
		t.Fatalf("%v allocations for a response with a number and a msgId, want <= 2", n)
	}
}
