package protocol

import (
	"bytes"
	"strconv"
	"testing"
	"unsafe"
)

// binaryFrame encodes c with a ROCKETMQ binary header and returns the frame
// without its length word.
func binaryFrame(t *testing.T, c *Command) []byte {
	t.Helper()
	f, err := c.AppendFrame(nil, SerializeRocketMQ)
	if err != nil {
		t.Fatal(err)
	}
	return f[4:]
}

// TestBinaryExtUnsplit checks a decoded binary header read in place: lookups
// (the last of repeated keys wins), ExtAt, typed decoding and re-encoding
// see the wire fields, and every mutation first splits them.
func TestBinaryExtUnsplit(t *testing.T) {
	src := NewRequest(ReqSendMessage)
	src.appendExt("topic", "T1")
	src.appendExt("queueId", "3")
	src.appendExt("topic", "T2") // repeated: the last wins
	src.appendExt("", "")
	frame := binaryFrame(t, src)

	c, err := DecodeFrame(bytes.Clone(frame))
	if err != nil {
		t.Fatal(err)
	}
	if c.rawN != 4 || len(c.ext) != 0 {
		t.Fatalf("decoded binary header split: rawN %d, %d split fields", c.rawN, len(c.ext))
	}
	if v, ok := c.Ext("topic"); !ok || v != "T2" {
		t.Fatalf("Ext(topic) = %q, %v; want the last, T2", v, ok)
	}
	if v, ok := c.Ext(""); !ok || v != "" {
		t.Fatalf("Ext(\"\") = %q, %v", v, ok)
	}
	if _, ok := c.Ext("missing"); ok {
		t.Fatal("Ext(missing) found")
	}
	if !commandsEqual(src, c) || c.ExtAt(2) != (ExtField{"topic", "T2"}) {
		t.Fatalf("got %s want %s", dumpCommand(c), dumpCommand(src))
	}
	for _, st := range []SerializeType{SerializeRocketMQ, SerializeJSON} {
		want, _ := src.AppendFrame(nil, st)
		if got, err := c.AppendFrame(nil, st); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("re-encoding in %d: %v\n got %q\nwant %q", st, err, got, want)
		}
	}
	var q GetMaxOffsetRequestHeader
	if err := q.Decode(c); err != nil || q.Topic != "T2" || q.QueueID != 3 {
		t.Fatalf("typed decode: %+v, %v", q, err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("ExtAt out of range did not panic")
			}
		}()
		c.ExtAt(4)
	}()

	// Mutations split first and then behave as on any Command.
	for _, mut := range []struct {
		name string
		do   func(c *Command)
		want []ExtField
	}{
		{"SetExt", func(c *Command) { c.SetExt("topic", "T3") }, []ExtField{{"topic", "T1"}, {"queueId", "3"}, {"topic", "T3"}, {"", ""}}},
		{"SetExtInt", func(c *Command) { c.SetExtInt("new", 1234) }, []ExtField{{"topic", "T1"}, {"queueId", "3"}, {"topic", "T2"}, {"", ""}, {"new", "1234"}}},
		{"DeleteExt", func(c *Command) { c.DeleteExt("topic") }, []ExtField{{"queueId", "3"}, {"", ""}}},
		{"ResetExt", func(c *Command) { c.ResetExt() }, nil},
	} {
		c, err := DecodeFrame(bytes.Clone(frame))
		if err != nil {
			t.Fatal(err)
		}
		mut.do(c)
		if c.rawN != 0 || c.NumExt() != len(mut.want) {
			t.Fatalf("%s: rawN %d, %s", mut.name, c.rawN, dumpCommand(c))
		}
		for i, f := range mut.want {
			if c.ExtAt(i) != f {
				t.Fatalf("%s: field %d = %+v, want %+v", mut.name, i, c.ExtAt(i), f)
			}
		}
	}
}

// TestBinaryExtManySplitAtOnce checks that a header with more fields than
// lazyMaxExt is split at decode, so that ExtAt stays O(1).
func TestBinaryExtManySplitAtOnce(t *testing.T) {
	src := NewRequest(1)
	for i := range lazyMaxExt + 1 {
		src.SetExt("k"+strconv.Itoa(i), strconv.Itoa(i))
	}
	c, err := DecodeFrame(binaryFrame(t, src))
	if err != nil {
		t.Fatal(err)
	}
	if c.rawN != 0 || len(c.ext) != lazyMaxExt+1 || !commandsEqual(src, c) {
		t.Fatalf("rawN %d, %d split: %s", c.rawN, len(c.ext), dumpCommand(c))
	}
}

// TestDecodeFrameAllocs pins the allocation budget of DecodeFrame (one
// object per frame, small for a binary header) and of DecodeFrameInto on a
// reused Command (none), for both header encodings.
func TestDecodeFrameAllocs(t *testing.T) {
	// A binary decode allocates a Command; a JSON one a commandExt, which
	// (with its 8-byte allocation header) must stay in the 640-byte class.
	if s := unsafe.Sizeof(Command{}); s > 120 {
		t.Errorf("Command is %d bytes, want <= 120", s)
	}
	if s := unsafe.Sizeof(commandExt{}); s > 632 {
		t.Errorf("commandExt is %d bytes, want <= 632", s)
	}
	for _, st := range []SerializeType{SerializeJSON, SerializeRocketMQ} {
		frame, err := benchSendRequest().AppendFrame(nil, st)
		if err != nil {
			t.Fatal(err)
		}
		frame = frame[4:]
		buf := make([]byte, len(frame))
		if n := testing.AllocsPerRun(100, func() {
			copy(buf, frame)
			if _, err := DecodeFrame(buf); err != nil {
				t.Fatal(err)
			}
		}); n != 1 {
			t.Errorf("st %d: DecodeFrame made %v allocations, want 1", st, n)
		}
		c := new(Command)
		if n := testing.AllocsPerRun(100, func() {
			copy(buf, frame)
			if err := DecodeFrameInto(c, buf); err != nil {
				t.Fatal(err)
			}
		}); n != 0 {
			t.Errorf("st %d: DecodeFrameInto a reused Command made %v allocations, want 0", st, n)
		}
		if !commandsEqual(c, benchSendRequest()) {
			t.Errorf("st %d: DecodeFrameInto got %s", st, dumpCommand(c))
		}
	}
}

// TestDecodeFrameIntoResets checks that DecodeFrameInto leaves nothing of the
// previous frame behind, whichever encodings follow each other.
func TestDecodeFrameIntoResets(t *testing.T) {
	a := NewRequest(1)
	a.Remark, a.Body = "r", []byte("body")
	for i := range 20 {
		a.SetExt("a"+strconv.Itoa(i), "x")
	}
	b := &Command{Code: 2}
	b.SetExt("b", "y")
	c := new(Command)
	for _, step := range []struct {
		src *Command
		st  SerializeType
	}{{a, SerializeJSON}, {b, SerializeRocketMQ}, {a, SerializeRocketMQ}, {b, SerializeJSON}, {a, SerializeRocketMQ}, {b, SerializeRocketMQ}} {
		f, err := step.src.AppendFrame(nil, step.st)
		if err != nil {
			t.Fatal(err)
		}
		if err := DecodeFrameInto(c, f[4:]); err != nil {
			t.Fatal(err)
		}
		if !commandsEqual(c, step.src) {
			t.Fatalf("st %d: got %s want %s", step.st, dumpCommand(c), dumpCommand(step.src))
		}
	}
}
