package client

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// capturedFrame reads a golden frame of transport/protocol/testdata/frames
// (captured from Apache RocketMQ's Java broker; see the README there) and
// decodes it.
func capturedFrame(t *testing.T, name string) *protocol.Command {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "protocol", "testdata", "frames", name))
	if err != nil {
		t.Fatal(err)
	}
	var digits strings.Builder
	for line := range strings.SplitSeq(string(raw), "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		digits.WriteString(strings.Join(strings.Fields(line), ""))
	}
	b, err := hex.DecodeString(digits.String())
	if err != nil {
		t.Fatal(err)
	}
	c, err := protocol.DecodeFrame(b[4:])
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestPullUnwrapsInnerBatch serves, from a small remoting server playing
// name server and broker, the pull answer the Java 5.3.3 broker gave for a
// queue.type=BatchCQ topic (pull_response_inner_batch_java_json.hex: a plain
// record, then a Java batch of 3 and one of 2, each stored as one
// inner-batch record). Pull returns the 6 messages at offsets 0..5, as Java's
// client unwraps them, and a tag filter applies to the unwrapped messages.
func TestPullUnwrapsInnerBatch(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	captured := capturedFrame(t, "pull_response_inner_batch_java_json.hex")
	topic := "bcq_TestJavaBrokerPullInnerBatch_116472"
	srv, err := remoting.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	a, err := srv.Listen(t.Context(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	addr := a.String()
	srv.Handle(protocol.ReqGetRouteInfoByTopic, remoting.ProcessorFunc(func(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
		d := protocol.TopicRouteData{
			QueueDatas:  []protocol.QueueData{{BrokerName: "broker-java", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}},
			BrokerDatas: []protocol.BrokerData{{Cluster: "c", BrokerName: "broker-java", BrokerAddrs: map[int64]string{0: addr}}},
		}
		resp := protocol.NewResponse(rc.Request(), 0, "")
		resp.Body, _ = d.Encode()
		return resp, nil
	}))
	srv.Handle(protocol.ReqPullMessage, remoting.ProcessorFunc(func(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
		resp := protocol.NewResponse(rc.Request(), captured.Code, captured.Remark)
		for i := range captured.NumExt() {
			f := captured.ExtAt(i)
			resp.SetExt(f.Key, f.Value)
		}
		resp.Body = captured.Body
		return resp, nil
	}))
	c, err := New(WithNameServers(addr), WithLogger(coreTestLogger()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx := testCtx(t, 10*time.Second)
	q := protocol.MessageQueue{Topic: topic, BrokerName: "broker-java", QueueID: 0}

	res, err := c.Pull(ctx, PullRequest{Queue: q, Offset: 0, Group: "g"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != PullFound || res.NextBeginOffset != 6 || len(res.Messages) != 6 {
		t.Fatalf("pull: %v next %d, %d messages", res.Status, res.NextBeginOffset, len(res.Messages))
	}
	bodies := []string{"runnel", topic + "-0", topic + "-1", topic + "-2", "second-0", "second-1"}
	seen := map[string]bool{}
	for i, m := range res.Messages {
		if m.QueueOffset != int64(i) || string(m.Body) != bodies[i] || m.Topic != topic || m.QueueID != 0 {
			t.Fatalf("message %d: offset %d body %q topic %q queue %d", i, m.QueueOffset, m.Body, m.Topic, m.QueueID)
		}
		if id := m.UniqKey(); id == "" || seen[id] {
			t.Fatalf("message %d: UNIQ_KEY %q (seen: %v)", i, id, seen)
		} else {
			seen[id] = true
		}
		if m.SysFlag&protocol.SysFlagNeedUnwrap != 0 {
			t.Fatalf("message %d still flagged for unwrapping: %#x", i, m.SysFlag)
		}
		if i == 0 {
			continue
		}
		wantI := i - 1 // the driver's batch index
		if i > 3 {
			wantI = i - 4
		}
		if v, _ := m.Property("javapeer_i"); v != fmt.Sprint(wantI) {
			t.Fatalf("message %d: javapeer_i %q", i, v)
		}
		if m.StoreHost != res.Messages[1].StoreHost || m.BornTimestamp == 0 || m.CommitLogOffset == 0 {
			t.Fatalf("message %d: store host %v born %d commit log offset %d", i, m.StoreHost, m.BornTimestamp, m.CommitLogOffset)
		}
	}
	// The inner messages carry their own tags, filtered one by one.
	res, err = c.Pull(ctx, PullRequest{Queue: q, Offset: 0, Group: "g", Expression: "b"})
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	for _, m := range res.Messages {
		got = append(got, m.QueueOffset)
	}
	if fmt.Sprint(got) != "[4 5]" {
		t.Fatalf("tag b: offsets %v, want [4 5]", got)
	}
}
