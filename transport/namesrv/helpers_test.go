package namesrv

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/runnel-dev/runnel/internal/testutil/poll"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

var rewrite = flag.Bool("rewrite", false, "rewrite golden files in testdata/")

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testLogger logs to stderr when NAMESRV_TEST_LOG is set, else discards.
func testLogger() *slog.Logger {
	if os.Getenv("NAMESRV_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return nil
}

// fakeClock is a settable clock for WithClock.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// startServer starts a name server on 127.0.0.1:0 and closes it at cleanup.
func startServer(t testing.TB, opts ...Option) *Server {
	t.Helper()
	opts = append([]Option{WithListenAddr("127.0.0.1:0"), WithLogger(testLogger())}, opts...)
	s, err := New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s
}

// dial connects a remoting client to addr, closed at cleanup.
func dial(t testing.TB, addr string) *remoting.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := remoting.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// invoke sends req and returns the response.
func invoke(t testing.TB, c *remoting.Conn, req *protocol.Command) *protocol.Command {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.Invoke(ctx, req)
	if err != nil {
		t.Fatalf("invoke code %d: %v", req.Code, err)
	}
	return resp
}

// expectCode fails unless resp has the given code.
func expectCode(t testing.TB, resp *protocol.Command, code int32) {
	t.Helper()
	if resp.Code != code {
		t.Fatalf("response code %d (remark %q), want %d", resp.Code, resp.Remark, code)
	}
}

// broker describes a test broker registration.
type broker struct {
	cluster, name, addr, ha string
	id                      int64
	topics                  map[string]protocol.TopicConfig
	dv                      protocol.DataVersion
	timeoutMillis           int64
}

func topic(name string, r, w, perm int32) protocol.TopicConfig {
	return protocol.TopicConfig{TopicName: name, ReadQueueNums: r, WriteQueueNums: w, Perm: perm,
		TopicFilterType: protocol.TopicFilterSingleTag, Attributes: map[string]string{}}
}

func topics(tcs ...protocol.TopicConfig) map[string]protocol.TopicConfig {
	m := make(map[string]protocol.TopicConfig, len(tcs))
	for _, tc := range tcs {
		m[tc.TopicName] = tc
	}
	return m
}

// registerRequest builds a REGISTER_BROKER request as a Java broker sends it
// (RegisterBrokerBody, bodyCrc32 set).
func (b *broker) registerRequest(t testing.TB) *protocol.Command {
	t.Helper()
	body := protocol.RegisterBrokerBody{TopicConfigSerializeWrapper: protocol.TopicConfigSerializeWrapper{
		DataVersion: b.dv, TopicConfigTable: b.topics}}
	raw, err := body.Encode()
	if err != nil {
		t.Fatal(err)
	}
	req := protocol.NewRequest(protocol.ReqRegisterBroker)
	h := protocol.RegisterBrokerRequestHeader{BrokerName: b.name, BrokerAddr: b.addr, ClusterName: b.cluster,
		HAServerAddr: b.ha, BrokerID: b.id, Compressed: protocol.Some(false),
		BodyCRC32: protocol.Some(int32(crc32.ChecksumIEEE(raw) & 0x7FFFFFFF))}
	if b.timeoutMillis > 0 {
		h.HeartbeatTimeoutMillis = protocol.Some(b.timeoutMillis)
	}
	h.Encode(req)
	req.Version = protocol.CurrentVersion // what remoting.Conn stamps; processors called directly need it
	req.Body = raw
	return req
}

// register registers b over c and expects success.
func (b *broker) register(t testing.TB, c *remoting.Conn) *protocol.Command {
	t.Helper()
	resp := invoke(t, c, b.registerRequest(t))
	expectCode(t, resp, protocol.ResSuccess)
	return resp
}

func routeRequest(topic string) *protocol.Command {
	req := protocol.NewRequest(protocol.ReqGetRouteInfoByTopic)
	(&protocol.GetRouteInfoRequestHeader{Topic: topic}).Encode(req)
	return req
}

// route looks topic up and returns the response.
func route(t testing.TB, c *remoting.Conn, topic string) *protocol.Command {
	t.Helper()
	return invoke(t, c, routeRequest(topic))
}

// checkGolden compares got with testdata/name, or rewrites it with -rewrite.
func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *rewrite {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatalf("%s mismatch\n got: %s\nwant: %s", name, got, want)
	}
}

// waitFor polls cond every few milliseconds until it returns nil or the
// deadline passes.
func waitFor(t testing.TB, total time.Duration, cond func() error) {
	t.Helper()
	poll.Until(t, total, 5*time.Millisecond, cond)
}

// goRoute is a route as rocketmq-client-go's TopicRouteData.decode sees it
// (protocol §5.1 "[G] parse rules"), emulated without the client.
type goRoute struct {
	orderTopicConf string
	brokers        map[string]map[int64]string // broker name → id → addr
}

// parseLikeGoClient applies the Go client's parse rules to a route body:
// brokerAddrs taken as raw text, first and last characters stripped, split
// on ',', each piece split at the first ':', quotes removed, id parsed with
// ParseInt (failure → 0). queueDatas must be present and an array.
func parseLikeGoClient(body []byte) (*goRoute, error) {
	s := string(body)
	qd := rawValue(s, "queueDatas")
	if !strings.HasPrefix(qd, "[") {
		return nil, fmt.Errorf("queueDatas %q is not an array", qd)
	}
	out := &goRoute{brokers: map[string]map[int64]string{}}
	if oc := rawValue(s, "orderTopicConf"); oc != "" {
		out.orderTopicConf = strings.Trim(oc, `"`)
	}
	bd := rawValue(s, "brokerDatas")
	for _, elem := range splitTopLevel(bd[1 : len(bd)-1]) {
		addrs := rawValue(elem, "brokerAddrs")
		if addrs == "" {
			return nil, errors.New("brokerAddrs missing: the Go client would panic")
		}
		name := strings.Trim(rawValue(elem, "brokerName"), `"`)
		m := map[int64]string{}
		inner := addrs[1 : len(addrs)-1]
		if inner != "" {
			for _, piece := range strings.Split(inner, ",") {
				k, v, ok := strings.Cut(piece, ":")
				if !ok {
					return nil, fmt.Errorf("brokerAddrs piece %q has no ':'", piece)
				}
				id, err := strconv.ParseInt(strings.ReplaceAll(k, `"`, ""), 10, 64)
				if err != nil {
					id = 0
				}
				m[id] = strings.ReplaceAll(v, `"`, "")
			}
		}
		out.brokers[name] = m
	}
	return out, nil
}

// rawValue returns the raw JSON text of the value of the first "key" at any
// depth of s (enough for these bodies, which have unique keys per object).
func rawValue(s, key string) string {
	i := strings.Index(s, `"`+key+`":`)
	if i < 0 {
		return ""
	}
	s = s[i+len(key)+3:]
	depth, inStr := 0, false
	for j := 0; j < len(s); j++ {
		c := s[j]
		switch {
		case inStr:
			if c == '\\' {
				j++
			} else if c == '"' {
				inStr = false
				if depth == 0 {
					return s[:j+1]
				}
			}
		case c == '"':
			inStr = true
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			depth--
			if depth == 0 {
				return s[:j+1]
			}
			if depth < 0 {
				return s[:j]
			}
		case c == ',' && depth == 0:
			return s[:j]
		}
	}
	return s
}

// splitTopLevel splits a JSON array's inner text into its elements.
func splitTopLevel(s string) []string {
	var out []string
	depth, inStr, start := 0, false, 0
	for j := 0; j < len(s); j++ {
		c := s[j]
		switch {
		case inStr:
			if c == '\\' {
				j++
			} else if c == '"' {
				inStr = false
			}
		case c == '"':
			inStr = true
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			depth--
		case c == ',' && depth == 0:
			out = append(out, s[start:j])
			start = j + 1
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}
