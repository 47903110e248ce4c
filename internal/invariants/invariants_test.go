package invariants

import "testing"

func TestSometimes(t *testing.T) {
	hits := 0
	for range 10000 {
		if Sometimes(50) {
			hits++
		}
	}
	if !Enabled {
		if hits != 0 {
			t.Fatalf("Sometimes fired %d times without the invariants tag", hits)
		}
		return
	}
	if hits < 4000 || hits > 6000 {
		t.Fatalf("Sometimes(50) fired %d/10000 times", hits)
	}
	if Sometimes(0) {
		t.Fatal("Sometimes(0) fired")
	}
}
