package protocol

import (
	"net/netip"
	"testing"
	"unsafe"
)

// TestNewResponseAllocs pins a send response to one allocation: the
// Command with its extFields and its arena, which holds the queue offset and
// the IPv4 message id (SetExtInt, SetExtBytes), in the 448-byte size class.
func TestNewResponseAllocs(t *testing.T) {
	if s := unsafe.Sizeof(commandRespExt{}); s > 440 {
		t.Errorf("commandRespExt is %d bytes, want <= 440", s)
	}
	req := NewRequest(ReqSendMessage)
	host := netip.MustParseAddrPort("10.0.0.5:10911")
	var resp *Command
	allocs := testing.AllocsPerRun(100, func() {
		resp = NewResponse(req, ResSuccess, "")
		h := SendMessageResponseHeader{
			QueueID:       3,
			QueueOffset:   1234567890123,
			TransactionID: "0A0000090001000000000000DEAD0001",
			MsgRegion:     "DefaultRegion",
			TraceOn:       Some(true),
		}
		h.Encode(resp)
		var idBuf [OffsetMsgIDLenV6]byte
		resp.SetExtBytes("msgId", AppendOffsetMsgID(idBuf[:0], host, 987654321))
	})
	if allocs != 1 {
		t.Errorf("send response: %v allocations, want 1", allocs)
	}
	if v, _ := resp.Ext("queueOffset"); v != "1234567890123" {
		t.Errorf("queueOffset %q", v)
	}
	if v, _ := resp.Ext("msgId"); v != OffsetMsgID(host, 987654321) {
		t.Errorf("msgId %q", v)
	}
	// Past the inline arena, numbers go to a new one; the old values stay.
	for i := range 10 {
		resp.SetExtInt("n"+string(rune('a'+i)), 1e18+int64(i))
	}
	if v, _ := resp.Ext("queueOffset"); v != "1234567890123" {
		t.Errorf("queueOffset after growth %q", v)
	}
	if v, _ := resp.Ext("nj"); v != "1000000000000000009" {
		t.Errorf("nj %q", v)
	}
}
