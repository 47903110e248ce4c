package protocol

import "testing"

// TestDecodedSerializeType: a decoded Command tells the header encoding of
// its frame, also when decoded into a reused Command; a built one is JSON.
func TestDecodedSerializeType(t *testing.T) {
	if st := NewRequest(10).SerializeType(); st != SerializeJSON {
		t.Fatalf("NewRequest: type %d", st)
	}
	if st := NewResponse(NewRequest(10), 0, "").SerializeType(); st != SerializeJSON {
		t.Fatalf("NewResponse: type %d", st)
	}
	reused := new(Command)
	for _, st := range []SerializeType{SerializeRocketMQ, SerializeJSON, SerializeRocketMQ} {
		f, err := benchSendRequest().AppendFrame(nil, st)
		if err != nil {
			t.Fatal(err)
		}
		c, err := DecodeFrame(append([]byte(nil), f[4:]...))
		if err != nil {
			t.Fatal(err)
		}
		if c.SerializeType() != st {
			t.Fatalf("DecodeFrame: type %d, want %d", c.SerializeType(), st)
		}
		if err := DecodeFrameInto(reused, append([]byte(nil), f[4:]...)); err != nil {
			t.Fatal(err)
		}
		if reused.SerializeType() != st {
			t.Fatalf("DecodeFrameInto: type %d, want %d", reused.SerializeType(), st)
		}
	}
}
