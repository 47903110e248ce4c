package broker

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/runnel-dev/runnel/transport/protocol"
)

func batchSendReq(t *testing.T, topic string, n, bodySize int) *protocol.Command {
	t.Helper()
	return batchReq(t, topic, n, func(i int) (int32, []byte, string) {
		return 0, []byte(strings.Repeat("b", bodySize)), props("KEYS", "k"+itoa(i))
	})
}

// TestMaxBatch: a batch within WithMaxBatch is stored; one with too many
// messages, too large a body, or one message above the message size is
// refused whole with MESSAGE_ILLEGAL and a remark naming the limit.
func TestMaxBatch(t *testing.T) {
	b := startBroker(t, WithMaxBatch(3, 1024), WithMaxMessageSize(300))
	c := dial(t, b.Addr())
	if resp := invoke(t, c, batchSendReq(t, "Batch", 3, 200)); resp.Code != protocol.ResSuccess {
		t.Fatalf("batch of 3: %d %s", resp.Code, resp.Remark)
	}
	maxOff := func() int64 { n, _ := b.store.MaxOffset("Batch", 0); return n }
	if maxOff() != 3 {
		t.Fatalf("max offset %d after a batch of 3", maxOff())
	}
	for _, tc := range []struct {
		name   string
		req    *protocol.Command
		remark string
	}{
		{"4 messages", batchSendReq(t, "Batch", 4, 10), "batch holds more than 3 messages"},
		{"body above 1024 bytes", batchSendReq(t, "Batch", 3, 320), "exceeds the maximum batch size 1024 bytes"},
		{"message above 300 bytes", batchSendReq(t, "Batch", 1, 301), "batch message body size 301 exceeds the maximum 300"},
	} {
		resp := invoke(t, c, tc.req)
		if resp.Code != protocol.ResMessageIllegal || !strings.Contains(resp.Remark, tc.remark) {
			t.Errorf("%s: code %d %q, want MESSAGE_ILLEGAL %q", tc.name, resp.Code, resp.Remark, tc.remark)
		}
	}
	if maxOff() != 3 {
		t.Fatalf("refused batches stored messages: max offset %d", maxOff())
	}
	// A single message is bounded by the message size only.
	if resp := invoke(t, c, sendReq("Batch", 0, make([]byte, 300), "")); resp.Code != protocol.ResSuccess {
		t.Fatalf("single message: %d %s", resp.Code, resp.Remark)
	}
}

func TestLimitOptionsValidate(t *testing.T) {
	for name, o := range map[string]Option{
		"batch msgs 0":       WithMaxBatch(0, 1),
		"batch msgs 65537":   WithMaxBatch(1<<16+1, 1),
		"batch bytes 0":      WithMaxBatch(1, 0),
		"batch bytes 65 MiB": WithMaxBatch(1, 65<<20),
		"watermark 0":        WithDiskHighWatermark(0),
		"watermark 1.01":     WithDiskHighWatermark(1.01),
		"watermark NaN":      WithDiskHighWatermark(math.NaN()),
	} {
		if _, err := New(WithDataDir(t.TempDir()), o); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := New(WithDataDir(t.TempDir()), WithDiskHighWatermark(1), WithMaxBatch(1, 1)); err != nil {
		t.Fatal(err)
	}
}
