package interop

import (
	"os"
	"testing"

	"github.com/apache/rocketmq-client-go/v2/rlog"
)

// TestMain silences the official client, which logs through a process-wide
// logrus logger at info level. That logger is the official client's global,
// acceptable here only because this module exists to exercise that client.
//
// There is no goleak check in this module: the official client leaves
// goroutines behind by design. Measured after every producer and admin of
// these tests was shut down, goleak.Find still reports four goroutines
// started by internal.(*rmqClient).Start (its timer loops, which sleep
// without watching for shutdown) and the janitor of a package-level
// go-cache instance. A leak check would only report the peer under test.
func TestMain(m *testing.M) {
	rlog.SetLogLevel("fatal")
	os.Exit(m.Run())
}
