package protocol

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
)

func haRecord(t testing.TB, topic string, queueOffset, phys int64) []byte {
	t.Helper()
	m := MessageExt{Topic: topic, QueueOffset: queueOffset, CommitLogOffset: phys, Body: []byte("body"),
		BornHost: netip.MustParseAddrPort("10.0.0.1:5000"), StoreHost: netip.MustParseAddrPort("10.0.0.2:10911"),
		Properties: string(AppendProperty(nil, PropKeys, "k1"))}
	rec, err := m.AppendRecord(nil)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// TestHAFramesGolden pins the fixed layouts taken from Java's encoders
// (AutoSwitchHAClient.reportSlaveOffset and sendHandshakeHeader,
// AutoSwitchHAConnection.buildTransferHeaderBuffer): state ordinal first,
// big-endian.
func TestHAFramesGolden(t *testing.T) {
	for _, c := range []struct {
		name string
		got  []byte
		want string
	}{
		{"slave report", AppendHASlaveReport(nil, 0x0102030405060708), "00000002" + "0102030405060708"},
		{"transfer header", AppendHATransferHeader(nil, 0x10, 0x0a0b, 3, 0x0c, 0x0d),
			"00000002" + "00000010" + "0000000000000a0b" + "00000003" + "000000000000000c" + "000000000000000d"},
		{"refusal", AppendHARefusal(nil, "no"), "00000004" + "00000002" + "0000000000000000" + "00000000" + hex.EncodeToString([]byte("no"))},
	} {
		if got := hex.EncodeToString(c.got); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
	hs, err := AppendHASlaveHandshake(nil, 1, HAIdentity{Cluster: "C", BrokerName: "b", BrokerAddr: "a", LogID: ""})
	if err != nil {
		t.Fatal(err)
	}
	// state 1, flags 0 (isSyncFromLastFile, isAsyncLearner), slaveBrokerId 1:
	// Java's 16 bytes; then runnel's identity body.
	if want := "00000001" + "00000000" + "0000000000000001" + "0000000b" + "000143" + "000162" + "000161" + "0000"; hex.EncodeToString(hs) != want {
		t.Errorf("slave handshake %x, want %s", hs, want)
	}
	if len(AppendHATransferHeader(nil, 0, 0, 0, 0, 0)) != HATransferHeaderLen || HATransferHeaderLen != 36 || HAMasterHeaderLen != 20 {
		t.Error("header sizes differ from AutoSwitchHAConnection's")
	}
}

func TestHAFramesRoundTrip(t *testing.T) {
	id := HAIdentity{Cluster: "DefaultCluster", BrokerName: "broker-a", BrokerAddr: "127.0.0.1:10911", LogID: "abc"}
	var stream []byte
	var err error
	stream, err = AppendHASlaveHandshake(stream, 7, id)
	if err != nil {
		t.Fatal(err)
	}
	stream = AppendHASlaveReport(stream, 12345)
	r := bufio.NewReader(iotest.OneByteReader(bytes.NewReader(stream)))
	f, err := ReadHASlaveFrame(r, 0)
	if err != nil || f.State != HAStateHandshake || f.BrokerID != 7 || f.Identity != id {
		t.Fatalf("handshake %+v %v", f, err)
	}
	f, err = ReadHASlaveFrame(r, 0)
	if err != nil || f.State != HAStateTransfer || f.MaxOffset != 12345 {
		t.Fatalf("report %+v %v", f, err)
	}
	if _, err := ReadHASlaveFrame(r, 0); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last frame: %v", err)
	}

	epochs := []HAEpoch{{1, 0}, {2, 500}, {5, 900}}
	var ms []byte
	if ms, err = AppendHAMasterHandshake(ms, 1000, 5, id, epochs); err != nil {
		t.Fatal(err)
	}
	rec1, rec2 := haRecord(t, "T", 0, 1000), haRecord(t, "T", 1, 1000+int64(len(haRecord(t, "T", 0, 0))))
	var body []byte
	if body, err = AppendHALogEntry(body, rec1, 42, []string{"k1", "u1"}); err != nil {
		t.Fatal(err)
	}
	if body, err = AppendHALogEntry(body, rec2, 0, nil); err != nil {
		t.Fatal(err)
	}
	ms = AppendHATransferHeader(ms, len(body), 1000, 5, 900, 2000)
	ms = append(ms, body...)
	ms = AppendHATransferHeader(ms, 0, 1200, 5, 900, 2000) // heartbeat
	ms = AppendHARefusal(ms, "go away")
	mr := bufio.NewReader(iotest.HalfReader(bytes.NewReader(ms)))
	var buf []byte
	mf, buf, err := ReadHAMasterFrame(mr, buf, 0)
	if err != nil || mf.State != HAStateHandshake || mf.Offset != 1000 || mf.Epoch != 5 {
		t.Fatalf("master handshake %+v %v", mf, err)
	}
	gid, geps, err := DecodeHAMasterHandshake(mf.Body)
	if err != nil || gid != id || !slices.Equal(geps, epochs) {
		t.Fatalf("master handshake body %+v %v %v", gid, geps, err)
	}
	mf, buf, err = ReadHAMasterFrame(mr, buf, 0)
	if err != nil || mf.State != HAStateTransfer || mf.Offset != 1000 || mf.Epoch != 5 || mf.EpochStartOffset != 900 || mf.ConfirmOffset != 2000 {
		t.Fatalf("transfer %+v %v", mf, err)
	}
	var got []HALogEntry
	if err := DecodeHALogEntries(mf.Body, nil, func(e *HALogEntry) error {
		c := *e
		c.Keys = slices.Clone(e.Keys)
		got = append(got, c)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !bytes.Equal(got[0].Record, rec1) || got[0].TagsCode != 42 || !slices.Equal(got[0].Keys, []string{"k1", "u1"}) ||
		!bytes.Equal(got[1].Record, rec2) || len(got[1].Keys) != 0 {
		t.Fatalf("entries %+v", got)
	}
	mf, buf, err = ReadHAMasterFrame(mr, buf, 0)
	if err != nil || mf.State != HAStateTransfer || len(mf.Body) != 0 || mf.Offset != 1200 {
		t.Fatalf("heartbeat %+v %v", mf, err)
	}
	mf, _, err = ReadHAMasterFrame(mr, buf, 0)
	if err != nil || mf.State != HAStateShutdown || string(mf.Body) != "go away" {
		t.Fatalf("refusal %+v %v", mf, err)
	}
}

func TestHAFramesMalformed(t *testing.T) {
	for name, in := range map[string][]byte{
		"unknown slave state":        {0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0},
		"negative report":            AppendHASlaveReport(nil, -1),
		"handshake body too long":    append(mustHex("00000001"+"00000000"+"0000000000000001"+"7fffffff"), 0),
		"handshake body not an id":   mustHex("00000001" + "00000000" + "0000000000000001" + "00000002" + "0005"),
		"handshake body trailing":    mustHex("00000001" + "00000000" + "0000000000000001" + "00000009" + "0000" + "0000" + "0000" + "0000" + "ff"),
		"report cut short":           mustHex("00000002" + "0000"),
		"handshake fixed part short": mustHex("00000001" + "0000"),
	} {
		_, err := ReadHASlaveFrame(bytes.NewReader(in), 1024)
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	for name, in := range map[string][]byte{
		"unknown master state": AppendHARefusal(nil, "x")[:0:0],
		"body too long":        AppendHATransferHeader(nil, 2048, 0, 0, 0, 0),
		"negative size":        AppendHATransferHeader(nil, -1, 0, 0, 0, 0),
		"negative offset":      AppendHATransferHeader(nil, 0, -5, 0, 0, 0),
		"body cut short":       append(AppendHATransferHeader(nil, 10, 0, 0, 0, 0), 1, 2, 3),
	} {
		if name == "unknown master state" {
			in = append(mustHex("00000007"+"00000000"+"0000000000000000"+"00000000"), in...)
		}
		_, _, err := ReadHAMasterFrame(bytes.NewReader(in), nil, 1024)
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	rec := haRecord(t, "T", 0, 0)
	body, _ := AppendHALogEntry(nil, rec, 1, []string{"k"})
	for name, b := range map[string][]byte{
		"record corrupt":        append(slices.Clone(body[:4]), make([]byte, 100)...),
		"dispatch data missing": body[:len(rec)+4],
		"key runs past":         append(slices.Clone(body[:len(rec)+10]), 0, 9, 'k'),
	} {
		if err := DecodeHALogEntries(b, nil, func(*HALogEntry) error { return nil }); !errors.Is(err, ErrMalformedHAFrame) {
			t.Errorf("%s: %v, want ErrMalformedHAFrame", name, err)
		}
	}
	if _, _, err := DecodeHAMasterHandshake(mustHex("0000" + "0000" + "0000" + "0000" + "00000002" + "00000002" + "0000000000000000" + "00000001" + "0000000000000000")); err == nil {
		t.Error("descending epochs accepted")
	}
}

func mustHex(s string) []byte {
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		panic(err)
	}
	return b
}

// FuzzHAFrames: the HA frame readers and body decoders never panic on any
// input, delivered whole or a byte at a time, and what they accept
// re-encodes to a frame they read back the same.
func FuzzHAFrames(f *testing.F) {
	hs, _ := AppendHASlaveHandshake(nil, 3, HAIdentity{Cluster: "c", BrokerName: "b", BrokerAddr: "a", LogID: "l"})
	f.Add(hs)
	f.Add(AppendHASlaveReport(nil, 99))
	mh, _ := AppendHAMasterHandshake(nil, 10, 2, HAIdentity{Cluster: "c"}, []HAEpoch{{1, 0}, {2, 5}})
	f.Add(mh)
	rec := haRecord(f, "T", 0, 0)
	body, _ := AppendHALogEntry(nil, rec, 7, []string{"k"})
	f.Add(append(AppendHATransferHeader(nil, len(body), 0, 1, 0, 9), body...))
	f.Add(AppendHARefusal(nil, "why"))
	f.Fuzz(func(t *testing.T, in []byte) {
		for _, r := range []io.Reader{bytes.NewReader(in), iotest.OneByteReader(bytes.NewReader(in))} {
			br := bufio.NewReader(r)
			if sf, err := ReadHASlaveFrame(br, 1<<16); err == nil {
				var again []byte
				if sf.State == HAStateHandshake {
					again, err = AppendHASlaveHandshake(nil, sf.BrokerID, sf.Identity)
					if err != nil {
						t.Fatal(err)
					}
				} else {
					again = AppendHASlaveReport(nil, sf.MaxOffset)
				}
				sf2, err := ReadHASlaveFrame(bytes.NewReader(again), 1<<16)
				if err != nil || sf2.State != sf.State || sf2.BrokerID != sf.BrokerID || sf2.Identity != sf.Identity || sf2.MaxOffset != sf.MaxOffset {
					t.Fatalf("slave frame %+v re-read as %+v (%v)", sf, sf2, err)
				}
			}
		}
		mf, _, err := ReadHAMasterFrame(bytes.NewReader(in), nil, 1<<16)
		if err != nil {
			return
		}
		switch mf.State {
		case HAStateHandshake:
			_, _, _ = DecodeHAMasterHandshake(mf.Body)
		case HAStateTransfer:
			_ = DecodeHALogEntries(mf.Body, nil, func(e *HALogEntry) error {
				if _, _, err := DecodeRecord(e.Record); err != nil {
					t.Fatalf("entry with an invalid record delivered: %v", err)
				}
				return nil
			})
		}
	})
}
