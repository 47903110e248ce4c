package broker

import "testing"

func TestFlushModeString(t *testing.T) {
	for m, want := range map[FlushMode]string{FlushSync: "sync", FlushAsync: "async", FlushMode(7): "FlushMode(7)"} {
		if got := m.String(); got != want {
			t.Errorf("%d: %q, want %q", int(m), got, want)
		}
	}
}
