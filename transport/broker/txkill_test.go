package broker

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// childBrokerEnv, when set to a data dir, turns the test binary into a
// broker process (see TestMain) that prints "addr <ip:port>" and serves
// until it is killed (or a minute passes).
const childBrokerEnv = "RUNNEL_BROKER_CHILD_DIR"

func runChildBroker(dir string) int {
	b, err := New(WithDataDir(dir), WithListenAddr("127.0.0.1:0"), WithFlushMode(FlushSync))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "child start:", err)
		return 2
	}
	fmt.Printf("addr %s\n", b.Addr())
	time.Sleep(time.Minute) // killed long before
	return 0
}

// startChildBroker runs a broker process on dir and returns its address.
func startChildBroker(t *testing.T, dir string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childBrokerEnv+"="+dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "addr ")
	if err != nil || !ok {
		t.Fatalf("child broker did not start: %q %v", line, err)
	}
	return cmd, addr
}

// A broker process killed with SIGKILL while transactions are being
// committed and rolled back recovers with every acknowledged end applied,
// nothing applied twice, and the unacknowledged ends still possible.
func TestBrokerTransactionKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("starts broker processes")
	}
	subLeakCheck(t)
	dir := t.TempDir()
	const n = 60
	type half struct {
		h      txHalf
		commit bool
		acked  bool
	}
	var halves []*half
	for round := range 2 {
		cmd, addr := startChildBroker(t, dir)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		conn, err := remoting.Dial(ctx, addr)
		if err != nil {
			t.Fatal(err)
		}
		c := &subClient{Conn: conn}
		start := len(halves)
		for i := range n {
			halves = append(halves, &half{
				h:      txSend(t, c, "txpg", "Kill9", 0, fmt.Sprintf("r%d-%d", round, i)),
				commit: i%2 == 0,
			})
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		acked := 0
		for _, hf := range halves[start:] {
			wg.Add(1)
			go func() {
				defer wg.Done()
				st := protocol.SysFlagTransactionRollback
				if hf.commit {
					st = protocol.SysFlagTransactionCommit
				}
				resp, err := conn.Invoke(ctx, endReq("txpg", hf.h, st, false))
				if err == nil && resp.Code == protocol.ResSuccess {
					mu.Lock()
					hf.acked = true
					acked++
					mu.Unlock()
				}
			}()
		}
		// Kill once some, but typically not all, ends were acknowledged.
		target := 1 + rand.IntN(n/2)
		deadline := time.Now().Add(5 * time.Second)
		for {
			mu.Lock()
			a := acked
			mu.Unlock()
			if a >= target || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		wg.Wait()
		cancel()
		_ = conn.Close()
		t.Logf("round %d: killed after %d of %d ends were acknowledged", round, acked, n)
	}

	b := subBroker(t, dir, &subClock{})
	c := subDial(t, b, "after-kill")
	count := func() map[string]int {
		m := map[string]int{}
		for _, msg := range subMessages(t, b, "Kill9", 0) {
			m[string(msg.Body)]++
		}
		return m
	}
	got := count()
	for i, hf := range halves {
		body := fmt.Sprintf("r%d-%d", i/n, i%n)
		switch {
		case got[body] > 1:
			t.Errorf("%s visible %d times", body, got[body])
		case hf.acked && hf.commit && got[body] != 1:
			t.Errorf("acknowledged commit of %s lost", body)
		case !hf.commit && got[body] != 0:
			t.Errorf("rolled back %s visible", body)
		}
	}
	// Every end can be (re)sent after the crash; the outcome is exactly once.
	for _, hf := range halves {
		st := protocol.SysFlagTransactionRollback
		if hf.commit {
			st = protocol.SysFlagTransactionCommit
		}
		mustEnd(t, c, "txpg", hf.h, st)
	}
	got = count()
	for i, hf := range halves {
		body := fmt.Sprintf("r%d-%d", i/n, i%n)
		want := 0
		if hf.commit {
			want = 1
		}
		if got[body] != want {
			t.Errorf("after re-sending every end, %s visible %d times, want %d", body, got[body], want)
		}
	}
}
