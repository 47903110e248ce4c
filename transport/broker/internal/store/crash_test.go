package store

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// crashChildEnv, when set to a directory, turns the test binary into the
// crash-test child (see TestMain).
const crashChildEnv = "RUNNEL_STORE_CRASH_CHILD"

// crashKillsEnv raises the number of kill -9 rounds of TestCrashRecovery.
const crashKillsEnv = "RUNNEL_STORE_CRASH_KILLS"

func bodyHash(b []byte) uint64 {
	h := fnv.New64a()
	_, _ = h.Write(b)
	return h.Sum64()
}

// runCrashChild opens the store in SYNC mode and Puts from several
// goroutines, printing one line per acknowledged message:
// "ack <topic> <queue> <offset> <hash>". It runs until killed (or 60 s).
func runCrashChild(dir string) int {
	s, err := Open(dir, Options{FlushMode: FlushSync})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child open:", err)
		return 2
	}
	var outMu sync.Mutex
	fail := make(chan error, 1)
	for w := range 6 {
		go func() {
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(w)))
			var line []byte
			for {
				n := 1 + rng.IntN(3)
				msgs := make([]PutMessage, n)
				for i := range msgs {
					body := make([]byte, 16+rng.IntN(600))
					for j := range body {
						body[j] = byte(rng.Uint32())
					}
					topic := fmt.Sprintf("crash%d", rng.IntN(2))
					q := int32(rng.IntN(4))
					rec, pos := makeRecord(topic, q, body, false)
					msgs[i] = PutMessage{Topic: topic, QueueID: q, Record: rec, StoreTimestampPos: pos,
						Keys: []string{fmt.Sprintf("w%d", w)}}
				}
				res, err := s.Put(context.Background(), msgs)
				if err != nil {
					select {
					case fail <- err:
					default:
					}
					return
				}
				line = line[:0]
				for i, r := range res {
					line = fmt.Appendf(line, "ack %s %d %d %d\n", msgs[i].Topic, msgs[i].QueueID,
						r.QueueOffset, bodyHash(recordBody(msgs[i].Record)))
				}
				outMu.Lock()
				_, werr := os.Stdout.Write(line)
				outMu.Unlock()
				if werr != nil {
					return
				}
			}
		}()
	}
	select {
	case err := <-fail:
		fmt.Fprintln(os.Stderr, "child put:", err)
		return 3
	case <-time.After(60 * time.Second):
		return 4
	}
}

type ackKey struct {
	topic string
	queue int32
	off   int64
}

func TestCrashRecovery(t *testing.T) {
	kills := 5
	if v := os.Getenv(crashKillsEnv); v != "" && !testing.Short() {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q", crashKillsEnv, v)
		}
		kills = n
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d, %d kills", seed, kills)
	rng := rand.New(rand.NewPCG(seed, 0))
	dir := t.TempDir()
	acked := make(map[ackKey]uint64)
	for round := range kills {
		// Alternate between killing at a random time and killing right after
		// reading a random ack (the instant right after a Put returned).
		delay, killAt := 5*time.Millisecond+time.Duration(rng.IntN(200))*time.Millisecond, 0
		if round%2 == 1 {
			killAt = 1 + rng.IntN(1500)
		}
		lines, stderr := runChildAndKill(t, dir, delay, killAt)
		newAcks := 0
		for _, l := range lines {
			var k ackKey
			var h uint64
			if _, err := fmt.Sscanf(l, "ack %s %d %d %d", &k.topic, &k.queue, &k.off, &h); err != nil {
				t.Fatalf("round %d: bad child line %q: %v", round, l, err)
			}
			if prev, ok := acked[k]; ok && prev != h {
				t.Fatalf("round %d: offset %v reused for a different payload", round, k)
			}
			acked[k] = h
			newAcks++
		}
		t.Logf("round %d: %d acks (total %d)", round, newAcks, len(acked))
		if newAcks == 0 && round == 0 {
			t.Fatalf("child acknowledged nothing; stderr: %s", stderr)
		}
		verifyCrashState(t, dir, acked)
	}
}

// runChildAndKill starts the child and SIGKILLs it right after reading its
// killAt-th ack (if killAt > 0) or else delay after its first ack, and
// returns its complete output lines.
func runChildAndKill(t *testing.T, dir string, delay time.Duration, killAt int) ([]string, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	first := make(chan struct{})
	var lines []string
	readDone := make(chan error, 1)
	go func() {
		r := bufio.NewReader(out)
		once := false
		for {
			l, err := r.ReadString('\n')
			if err != nil {
				// A partial last line (killed mid-write) is dropped.
				if errors.Is(err, io.EOF) {
					err = nil
				}
				readDone <- err
				return
			}
			lines = append(lines, l[:len(l)-1])
			if len(lines) == killAt {
				_ = cmd.Process.Signal(syscall.SIGKILL)
			}
			if !once {
				once = true
				close(first)
			}
		}
	}()
	select {
	case <-first:
		if killAt == 0 {
			<-time.After(delay)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("child produced no ack in 30s")
	}
	if killAt > 0 {
		// The reader kills at the killAt-th ack; bound the wait.
		select {
		case err := <-readDone:
			_ = cmd.Wait()
			if err != nil {
				t.Fatal(err)
			}
			return lines, stderr.String()
		case <-time.After(30 * time.Second):
		}
	}
	// Killing an already dead process only returns "process already finished".
	_ = cmd.Process.Signal(syscall.SIGKILL)
	if err := <-readDone; err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait() // "signal: killed" (or the child's own failure, seen in stderr)
	return lines, stderr.String()
}

func verifyCrashState(t *testing.T, dir string, acked map[ackKey]uint64) {
	t.Helper()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatalf("reopen after kill: %v", err)
	}
	defer s.Close()
	for k, h := range acked {
		found := false
		_, err := s.Get(k.topic, k.queue, k.off, 1, 0, func(rec []byte, _ int64) bool {
			found = recQueueOffset(rec) == k.off && bodyHash(recordBody(rec)) == h
			return true
		})
		if err != nil || !found {
			t.Fatalf("acknowledged %v missing or different after crash (err %v)", k, err)
		}
	}
	physSeen := make(map[int64]bool)
	for _, topic := range []string{"crash0", "crash1"} {
		ids, _ := s.QueueIDs(topic)
		for _, q := range ids {
			maxOff, _ := s.MaxOffset(topic, q)
			recs := getAll(t, s, topic, q, 0)
			if int64(len(recs)) != maxOff {
				t.Fatalf("%s/%d: %d records but max offset %d", topic, q, len(recs), maxOff)
			}
			for i, r := range recs {
				if recQueueOffset(r) != int64(i) {
					t.Fatalf("%s/%d: offsets not dense at %d", topic, q, i)
				}
				p := recordPhys(r)
				if physSeen[p] || p+int64(len(r)) > s.physNext {
					t.Fatalf("%s/%d@%d: physical offset %d (len %d) duplicate or beyond counter %d",
						topic, q, i, p, len(r), s.physNext)
				}
				physSeen[p] = true
				if got, err := s.GetByPhysicalOffset(p); err != nil || !bytes.Equal(got, r) {
					t.Fatalf("phys %d does not resolve: %v", p, err)
				}
			}
		}
	}
}
