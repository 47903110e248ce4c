package remoting

import (
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestAcceptPacer: the zero pacer never waits; a pacer of interval i and
// burst b lets b accepts through back to back, then one per i, and a quiet
// spell refills the burst but no more than it.
func TestAcceptPacer(t *testing.T) {
	var zero acceptPacer
	now := time.Unix(1000, 0)
	for range 100 {
		if d := zero.next(now); d != 0 {
			t.Fatalf("zero pacer waits %v", d)
		}
	}
	const i = 10 * time.Millisecond
	p := acceptPacer{interval: i, slack: 3 * i}
	for k := range 3 {
		if d := p.next(now); d != 0 {
			t.Fatalf("accept %d of the burst waits %v", k, d)
		}
	}
	for k := 1; k <= 4; k++ {
		// Accepts made at once beyond the burst: each waits one more interval.
		if d := p.next(now); d != time.Duration(k)*i {
			t.Fatalf("accept %d beyond the burst waits %v, want %v", k, d, time.Duration(k)*i)
		}
	}
	// After a long quiet spell: a full burst again, not more.
	now = now.Add(time.Hour)
	for k := range 3 {
		if d := p.next(now); d != 0 {
			t.Fatalf("after a pause, accept %d waits %v", k, d)
		}
	}
	if d := p.next(now); d != i {
		t.Fatalf("after a pause, the accept beyond the burst waits %v, want %v", d, i)
	}
}

// TestServerMaxConnRate dials connections all at once at a Server paced to
// 20 per second with a burst of 2: every one is served (the rest wait in
// the listen backlog, not refused), over at least the time the rate
// allows, and the held-back accepts are counted. Without the option none
// is held back.
func TestServerMaxConnRate(t *testing.T) {
	const n = 8
	dialAll := func(addr string) time.Duration {
		start := time.Now()
		// Every TCP connection is set up (the kernel completes handshakes
		// into the listen backlog whatever the accept loop does) before
		// any is used, from one goroutine: connections dialled from n
		// goroutines on a loaded machine may reach the listener spread over
		// more than the pacer's interval, and then are rightly not held
		// back, which made the paced count below flaky.
		ncs := make([]net.Conn, n)
		for k := range ncs {
			nc, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			ncs[k] = nc
		}
		var wg sync.WaitGroup
		for k := range n {
			wg.Go(func() {
				c, err := NewConn(ncs[k], WithLogger(testLogger()))
				if err != nil {
					t.Error(err)
					_ = ncs[k].Close()
					return
				}
				defer c.Close()
				resp, err := c.Invoke(ctxT(t, 10*time.Second), echoReq(k))
				if err == nil {
					err = checkEcho(resp, k)
				}
				if err != nil {
					t.Errorf("conn %d: %v", k, err)
				}
			})
		}
		wg.Wait()
		return time.Since(start)
	}
	s, addr := newTestServer(t, WithMaxConnRate(20, 2), WithMaxConnsPerIP(0))
	took := dialAll(addr)
	// n-2 accepts beyond the burst, 50 ms apart; the last one waits no
	// more after it is accepted.
	if want := time.Duration(n-3) * 50 * time.Millisecond; took < want {
		t.Fatalf("%d connections served in %v at 20/s with a burst of 2, want at least %v", n, took, want)
	}
	if st := s.Stats(); st.Accepted != n || st.PacedAccepts < n-2 {
		t.Fatalf("stats %+v: want %d accepted, at least %d paced", st, n, n-2)
	}
	free, faddr := newTestServer(t, WithMaxConnsPerIP(0))
	if took := dialAll(faddr); took > 5*time.Second {
		t.Fatalf("unpaced: %v", took)
	}
	if st := free.Stats(); st.PacedAccepts != 0 {
		t.Fatalf("unpaced server counted %d paced accepts", st.PacedAccepts)
	}
}

func TestServerMaxConnRateInvalid(t *testing.T) {
	for _, c := range [][2]int{{-1, 1}, {10, 0}, {0, 5}, {2_000_000, 1}, {5, -1}} {
		_, err := NewServer(WithMaxConnRate(c[0], c[1]))
		if err == nil || !strings.Contains(err.Error(), "connection rate") {
			t.Errorf("WithMaxConnRate(%d, %d): NewServer error %v, want a connection rate error", c[0], c[1], err)
		}
	}
	if _, err := NewServer(WithMaxConnRate(0, 0)); err != nil {
		t.Errorf("WithMaxConnRate(0, 0): %v", err)
	}
}
