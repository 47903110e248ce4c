//go:build !runnelshim

package interop

import (
	"testing"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// Without the runnelshim tag the official frame codec is out of reach (it is
// in the client's internal/remote package): scripts/bench.sh builds with it.

func officialHeaderEncode(b *testing.B, _ protocol.SerializeType) {
	b.Skip("the official frame codec needs scripts/bench.sh (runnelshim tag)")
}

func officialHeaderDecode(b *testing.B, _ []byte) {
	b.Skip("the official frame codec needs scripts/bench.sh (runnelshim tag)")
}
