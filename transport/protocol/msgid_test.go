package protocol

import (
	"bufio"
	"errors"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestOffsetMsgIDGolden(t *testing.T) {
	f, err := os.Open("testdata/messages/msgid_4_5.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		fs := strings.Fields(line)
		host := netip.MustParseAddrPort(fs[0])
		phys, _ := strconv.ParseInt(fs[1], 10, 64)
		if got := OffsetMsgID(host, phys); got != fs[2] {
			t.Errorf("OffsetMsgID(%v, %d) = %s, want %s", host, phys, got, fs[2])
		}
		h, p, err := ParseOffsetMsgID(fs[2])
		if err != nil || h != host || p != phys {
			t.Errorf("Parse(%s) = %v %d %v", fs[2], h, p, err)
		}
		// Lower case parses too (Java upper-cases first).
		if h, p, err := ParseOffsetMsgID(strings.ToLower(fs[2])); err != nil || h != host || p != phys {
			t.Errorf("lower case: %v", err)
		}
		n++
	}
	if n == 0 {
		t.Fatal("no golden lines")
	}
}

func TestOffsetMsgIDIPv6(t *testing.T) {
	host := netip.MustParseAddrPort("[2001:db8::5]:10911")
	id := OffsetMsgID(host, -1)
	if len(id) != OffsetMsgIDLenV6 || id != "20010DB8000000000000000000000005"+"00002A9F"+"FFFFFFFFFFFFFFFF" {
		t.Fatal(id)
	}
	h, p, err := ParseOffsetMsgID(id)
	if err != nil || h != host || p != -1 {
		t.Fatalf("%v %d %v", h, p, err)
	}
	for _, bad := range []string{"", "0A00000500002A9F000000000000002", "0A00000500002A9F000000000000002AB", "0A00000500002A9F00000000000000G2", "0A0000058000000F000000000000002A", "0A00000500012A9F000000000000002A"} {
		if _, _, err := ParseOffsetMsgID(bad); !errors.Is(err, ErrMsgIDInvalid) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func TestUniqIDGenerator(t *testing.T) {
	g := NewUniqIDGenerator(netip.MustParseAddr("10.0.0.9"), 0x12345)
	now := time.Date(2024, 3, 2, 0, 0, 1, 500e6, time.UTC) // 1 day 1.5 s into March
	id := string(g.AppendNextAt(nil, now))
	if len(id) != 32 || g.Len() != 32 || strings.ToUpper(id) != id {
		t.Fatal(id)
	}
	if id[:12] != "0A0000092345" {
		t.Fatalf("prefix %s", id[:12])
	}
	ms, _ := strconv.ParseUint(id[20:28], 16, 32)
	if ms != 86400*1000+1500 {
		t.Fatalf("millis since month start %d", ms)
	}
	c1, _ := strconv.ParseUint(id[28:], 16, 16)
	id2 := string(g.AppendNextAt(nil, now))
	c2, _ := strconv.ParseUint(id2[28:], 16, 16)
	if uint16(c1+1) != uint16(c2) || id[:28] != id2[:28] {
		t.Fatalf("counter %s %s", id, id2)
	}
	// Month change resets the time part.
	id3 := string(g.AppendNextAt(nil, time.Date(2024, 4, 1, 0, 0, 0, 7e6, time.UTC)))
	if id3[20:28] != "00000007" {
		t.Fatal(id3)
	}
	// A second generator has another random part; IPv6 hosts give 56 chars.
	if g2 := NewUniqIDGenerator(netip.MustParseAddr("10.0.0.9"), 0x12345); g2.Next()[12:20] == id[12:20] {
		t.Log("random parts collided (1 in 2^32)")
	}
	if g6 := NewUniqIDGenerator(netip.MustParseAddr("2001:db8::1"), 1); len(g6.Next()) != 56 || g6.Len() != 56 {
		t.Fatal("IPv6 length")
	}
}

func TestUniqIDGeneratorConcurrent(t *testing.T) {
	g := NewUniqIDGenerator(netip.MustParseAddr("127.0.0.1"), 1)
	const workers, per = 4, 1000
	ids := make([][]string, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for range per {
				ids[w] = append(ids[w], g.Next())
			}
		})
	}
	wg.Wait()
	seen := map[string]bool{}
	for _, l := range ids {
		for _, id := range l {
			if seen[id] {
				t.Fatalf("duplicate %s", id)
			}
			seen[id] = true
		}
	}
}

func FuzzParseOffsetMsgID(f *testing.F) {
	f.Add("0A00000500002A9F000000000000002A")
	f.Add(OffsetMsgID(netip.MustParseAddrPort("[::1]:80"), 5))
	f.Add("zz")
	f.Fuzz(func(t *testing.T, s string) {
		h, p, err := ParseOffsetMsgID(s)
		if err != nil {
			return
		}
		if got := OffsetMsgID(h, p); got != strings.ToUpper(s) {
			// IPv4-mapped IPv6 in a 56-char id re-encodes as 32 chars.
			if !(h.Addr().Is4In6() && len(s) == OffsetMsgIDLenV6) {
				t.Fatalf("round trip %s -> %s", s, got)
			}
		}
	})
}

func BenchmarkUniqID(b *testing.B) {
	g := NewUniqIDGenerator(netip.MustParseAddr("10.0.0.9"), 4242)
	buf := make([]byte, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		buf = g.AppendNext(buf[:0])
	}
}

func BenchmarkOffsetMsgID(b *testing.B) {
	host := netip.MustParseAddrPort("10.0.0.5:10911")
	buf := make([]byte, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendOffsetMsgID(buf[:0], host, 123456789)
		if _, _, err := ParseOffsetMsgID(msgAlias(buf)); err != nil {
			b.Fatal(err)
		}
	}
}
