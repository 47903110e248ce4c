package interop

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/javapeer"
)

// TestScaleoutETLKillJava is the scale-out kill test against Apache
// RocketMQ's own Java broker (5.3.3): three ETL worker processes, kills at
// random instants with replacements on empty state directories, the output
// read back with the official Go client and checked by the E1 oracle. The
// job's topics, consumer group, queue locks (whose 60 s expiry the workers
// do not wait for when the holder has left), commit chains, changelogs,
// repartition topic and transactions all run on the Java broker. Fewer
// orders and kills than on the embedded broker: the Java broker starts in
// about ten seconds and its transaction checks come every few seconds.
func TestScaleoutETLKillJava(t *testing.T) {
	if raceEnabled {
		runWithoutRace(t, "^TestScaleoutETLKillJava$")
		return
	}
	d := javapeer.Require(t)
	jc := d.RunCluster(t)
	seed := testSeedSO(t)
	rng := rand.New(rand.NewPCG(seed, 24))
	e := &soEnv{t: t, ns: jc.NameServer, base: t.TempDir()}
	e.setup(jc.Broker, 30_000, seed)
	workers := make([]*soChild, 3)
	dirs := make([]string, 3)
	for i := range workers {
		dirs[i] = e.newDir()
		workers[i] = e.start(fmt.Sprintf("j%d-0", i), dirs[i], "")
	}
	defer stopAll(workers)
	const kills = 6
	for k := range kills {
		time.Sleep(time.Duration(1500+rng.IntN(2500)) * time.Millisecond)
		i := rng.IntN(len(workers))
		w := workers[i]
		select {
		case err := <-w.done:
			t.Fatalf("worker %s ended on its own: %v\n%s", w.name, err, w.out.String())
		default:
			_ = w.cmd.Process.Signal(syscall.SIGKILL)
			<-w.done
		}
		fresh := k%2 == 0
		if fresh {
			dirs[i] = e.newDir()
		}
		workers[i] = e.start(fmt.Sprintf("j%d-%d", i, k+1), dirs[i], "")
		o, dl := e.committed()
		t.Logf("kill %d: worker %d (restarted on %s state directory): %d outputs, %d dead letters committed",
			k+1, i, map[bool]string{true: "an empty", false: "its"}[fresh], o, dl)
	}
	r, bad := e.finish(workers, dirs)
	t.Logf("oracle: %s", r)
	if bad != 0 {
		t.Fatalf("oracle: %s\n%s", r, strings.Join(r.Examples, "\n"))
	}
}
