package e2e

import (
	"flag"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
)

var seedFlag = flag.Uint64("seed", 0, "seed for randomized e2e tests (0 = random; also RUNNEL_SEED)")

// testSeed returns the seed of a randomized test, printing it so that a
// failure can be replayed with -seed or RUNNEL_SEED.
func testSeed(t *testing.T) uint64 {
	t.Helper()
	seed := *seedFlag
	if seed == 0 {
		if s, err := strconv.ParseUint(os.Getenv("RUNNEL_SEED"), 10, 64); err == nil {
			seed = s
		}
	}
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (replay with -seed=%d)", seed, seed)
	return seed
}
