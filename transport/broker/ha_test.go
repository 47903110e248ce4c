package broker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil/poll"
	"github.com/runnel-dev/runnel/transport/namesrv"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// haPair is a name server, a master and a slave of one broker name.
type haPair struct {
	ns            string
	master, slave *Broker
}

// fastHA are HA intervals short enough for tests.
var fastHA = []Option{WithHAIntervals(100*time.Millisecond, 2*time.Second, 32<<10), WithSlaveSyncInterval(100 * time.Millisecond)}

// startPair starts a name server, a master of role and a slave that
// learns its master from the name server; both shut down at the end.
func startPair(t testing.TB, role Role, masterOpts, slaveOpts []Option) *haPair {
	t.Helper()
	ns := startNameServer(t)
	m := startBroker(t, append(append([]Option{WithNameServers(ns.Addr()), WithRole(role)}, fastHA...), masterOpts...)...)
	s := startBroker(t, append(append([]Option{WithNameServers(ns.Addr()), WithRole(RoleSlave), WithBrokerID(1)}, fastHA...), slaveOpts...)...)
	p := &haPair{ns: ns.Addr(), master: m, slave: s}
	p.waitConnected(t)
	return p
}

func (p *haPair) waitConnected(t testing.TB) {
	t.Helper()
	poll.Until(t, 15*time.Second, 5*time.Millisecond, func() error {
		if n := len(p.master.HAStatus().Slaves); n != 1 {
			return fmt.Errorf("master has %d slaves (slave: %+v)", n, p.slave.HAStatus().Master)
		}
		return nil
	})
}

// waitCaughtUp waits until the slave's log end is the master's.
func waitCaughtUp(t testing.TB, m, s *Broker) {
	t.Helper()
	poll.Until(t, 15*time.Second, 5*time.Millisecond, func() error {
		if me, se := m.HAStatus().LogEnd, s.HAStatus().LogEnd; me != se {
			return fmt.Errorf("slave log end %d, master's %d (slave: %+v)", se, me, s.HAStatus().Master)
		}
		return nil
	})
}

// queueDump is everything a pull of a queue returns, for comparing brokers.
func queueDump(t testing.TB, c *remoting.Conn, topic string, q int32) []byte {
	t.Helper()
	var out []byte
	for off := int64(0); ; {
		r := invoke(t, c, pullRequest(pullArgs{topic: topic, queue: q, offset: off, max: 32}))
		if r.Code != protocol.ResSuccess {
			return out
		}
		var h protocol.PullMessageResponseHeader
		if err := h.Decode(r); err != nil {
			t.Fatal(err)
		}
		out = append(out, r.Body...)
		off = h.NextBeginOffset
	}
}

func TestBrokerHAReplicatesAndServes(t *testing.T) {
	p := startPair(t, RoleSyncMaster, nil, nil)
	mc, sc := dial(t, p.master.Addr()), dial(t, p.slave.Addr())
	createTopic(t, mc, "ha-t", 3)
	var ids []string
	for i := range 30 {
		rh := send(t, mc, "ha-t", int32(i%3), []byte(fmt.Sprint("body-", i)),
			props(protocol.PropKeys, fmt.Sprintf("k%d shared", i), protocol.PropTags, fmt.Sprint("tag", i%2)))
		ids = append(ids, rh.MsgID)
	}
	resp := invoke(t, mc, batchReq(t, "ha-t", 5, func(i int) (int32, []byte, string) {
		return 0, []byte(fmt.Sprint("batch-", i)), props(protocol.PropKeys, fmt.Sprint("bk", i))
	}))
	if resp.Code != protocol.ResSuccess {
		t.Fatalf("batch to a SYNC_MASTER with its slave: code %d %s", resp.Code, resp.Remark)
	}
	// A SYNC_MASTER answered: the slave has everything.
	if me, se := p.master.HAStatus().LogEnd, p.slave.HAStatus().LogEnd; me != se {
		t.Fatalf("after acknowledged SYNC_MASTER sends the slave's log ends at %d, the master's at %d", se, me)
	}
	poll.Until(t, 10*time.Second, 5*time.Millisecond, func() error {
		if _, ok := p.slave.topics.get("ha-t"); !ok {
			return errors.New("the slave has not copied the topic config yet")
		}
		return nil
	})
	for q := range int32(3) {
		a, b := queueDump(t, mc, "ha-t", q), queueDump(t, sc, "ha-t", q)
		if len(a) == 0 || !bytes.Equal(a, b) {
			t.Fatalf("queue %d: master returned %d bytes, slave %d (equal: %v)", q, len(a), len(b), bytes.Equal(a, b))
		}
	}
	// Lookups by offset message id and by key give the same answers.
	for _, id := range ids[:5] {
		a, b := viewByID(t, mc, id), viewByID(t, sc, id)
		if len(a) == 0 || !bytes.Equal(a, b) {
			t.Fatalf("VIEW_MESSAGE_BY_ID %s: master %d bytes, slave %d", id, len(a), len(b))
		}
	}
	for _, k := range []string{"k7", "shared", "bk3"} {
		a, b := queryByKey(t, mc, "ha-t", k), queryByKey(t, sc, "ha-t", k)
		if a == 0 || a != b {
			t.Fatalf("QUERY_MESSAGE %q: master %d messages, slave %d", k, a, b)
		}
	}
	// The slave refuses writes with RocketMQ's codes.
	if r := invoke(t, sc, sendReq("ha-t", 0, []byte("x"), "")); r.Code != protocol.ResServiceNotAvailable {
		t.Fatalf("send to the slave: code %d %s, want SERVICE_NOT_AVAILABLE", r.Code, r.Remark)
	}
	st := p.master.HAStatus()
	if len(st.Slaves) != 1 || st.Slaves[0].BrokerID != 1 || !st.Slaves[0].InSync || st.Slaves[0].Addr != p.slave.AdvertisedAddr() {
		t.Fatalf("master's HA status: %+v", st)
	}
	if ml := p.slave.HAStatus().Master; ml == nil || !ml.Connected || ml.MasterAddr != p.master.AdvertisedAddr() {
		t.Fatalf("slave's HA status: %+v", ml)
	}
}

func viewByID(t testing.TB, c *remoting.Conn, id string) []byte {
	t.Helper()
	_, off, err := protocol.ParseOffsetMsgID(id)
	if err != nil {
		t.Fatal(err)
	}
	req := protocol.NewRequest(protocol.ReqViewMessageByID)
	(&protocol.ViewMessageRequestHeader{Offset: off}).Encode(req)
	r := invoke(t, c, req)
	if r.Code != protocol.ResSuccess {
		t.Fatalf("VIEW_MESSAGE_BY_ID %s: code %d %s", id, r.Code, r.Remark)
	}
	return r.Body
}

func queryByKey(t testing.TB, c *remoting.Conn, topic, key string) int {
	t.Helper()
	req := protocol.NewRequest(protocol.ReqQueryMessage)
	(&protocol.QueryMessageRequestHeader{Topic: topic, Key: key, MaxNum: 64, BeginTimestamp: 0, EndTimestamp: time.Now().Add(time.Hour).UnixMilli()}).Encode(req)
	r := invoke(t, c, req)
	if r.Code != protocol.ResSuccess {
		return 0
	}
	n := 0
	if err := protocol.DecodeRecords(r.Body, func(*protocol.MessageExt) bool { n++; return true }); err != nil {
		t.Fatal(err)
	}
	return n
}

// createTopic creates topic with queues queues through c.
func createTopic(t testing.TB, c *remoting.Conn, topic string, queues int32) {
	t.Helper()
	req := protocol.NewRequest(protocol.ReqUpdateAndCreateTopic)
	(&protocol.CreateTopicRequestHeader{Topic: topic, DefaultTopic: topicDefault, ReadQueueNums: queues,
		WriteQueueNums: queues, Perm: protocol.PermRead | protocol.PermWrite, TopicFilterType: protocol.TopicFilterSingleTag}).Encode(req)
	if r := invoke(t, c, req); r.Code != protocol.ResSuccess {
		t.Fatalf("create topic %s: code %d %s", topic, r.Code, r.Remark)
	}
}

// stall is a WithHAControl hook that holds the slave (it stops reading
// from its master) between hold and release.
type stall struct {
	mu   sync.Mutex
	gate chan struct{} // non-nil while held
}

func (st *stall) option() Option {
	return WithHAControl(func(ctx context.Context, _ int64, _ int) error {
		st.mu.Lock()
		g := st.gate
		st.mu.Unlock()
		if g == nil {
			return nil
		}
		select {
		case <-g:
		case <-ctx.Done():
		}
		return nil
	})
}

func (st *stall) hold() {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.gate == nil {
		st.gate = make(chan struct{})
	}
}

func (st *stall) release() {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.gate != nil {
		close(st.gate)
		st.gate = nil
	}
}

// sendCode sends one message and returns the response code (the message
// is stored whatever it is, for the HA codes).
func sendCode(t testing.TB, c *remoting.Conn, topic string, body string, p string) (int32, protocol.SendMessageResponseHeader) {
	t.Helper()
	resp := invoke(t, c, sendReq(topic, 0, []byte(body), p))
	var rh protocol.SendMessageResponseHeader
	switch resp.Code {
	case protocol.ResSuccess, protocol.ResFlushSlaveTimeout, protocol.ResSlaveNotAvailable:
		if err := rh.Decode(resp); err != nil {
			t.Fatalf("send response with code %d: %v", resp.Code, err)
		}
	default:
		t.Fatalf("send: code %d %s", resp.Code, resp.Remark)
	}
	return resp.Code, rh
}

// TestBrokerHASyncMasterStatuses: a SYNC_MASTER answers SLAVE_NOT_AVAILABLE
// without a slave, FLUSH_SLAVE_TIMEOUT when its slave does not acknowledge
// within the slave timeout, SEND_OK once it does; the message is stored in
// every case. WAIT=false and an ASYNC_MASTER do not wait.
func TestBrokerHASyncMasterStatuses(t *testing.T) {
	ns := startNameServer(t)
	m := startBroker(t, append([]Option{WithNameServers(ns.Addr()), WithRole(RoleSyncMaster),
		WithSlaveTimeout(300*time.Millisecond, DefaultHAMaxGap)}, fastHA...)...)
	mc := dial(t, m.Addr())
	createTopic(t, mc, "sync-t", 1)
	start := time.Now()
	code, rh := sendCode(t, mc, "sync-t", "alone", "")
	if code != protocol.ResSlaveNotAvailable || time.Since(start) > 250*time.Millisecond {
		t.Fatalf("send without a slave: code %d after %v, want SLAVE_NOT_AVAILABLE at once", code, time.Since(start))
	}
	if r := pull(t, mc, pullArgs{topic: "sync-t", offset: rh.QueueOffset, max: 1}); len(r.msgs) != 1 || string(r.msgs[0].Body) != "alone" {
		t.Fatalf("the SLAVE_NOT_AVAILABLE message is not stored: %+v", r)
	}
	if resp := invoke(t, mc, batchReq(t, "sync-t", 2, func(i int) (int32, []byte, string) { return 0, []byte("b"), "" })); resp.Code != protocol.ResSlaveNotAvailable {
		t.Fatalf("batch without a slave: code %d %s", resp.Code, resp.Remark)
	}

	var st stall
	s := startBroker(t, append([]Option{WithNameServers(ns.Addr()), WithRole(RoleSlave), WithBrokerID(1), st.option()}, fastHA...)...)
	p := &haPair{master: m, slave: s}
	p.waitConnected(t)
	waitCaughtUp(t, m, s)
	if code, _ := sendCode(t, mc, "sync-t", "with slave", ""); code != protocol.ResSuccess {
		t.Fatalf("send with the slave in sync: code %d, want SEND_OK", code)
	}
	st.hold()
	start = time.Now()
	code, rh = sendCode(t, mc, "sync-t", "stalled", "")
	took := time.Since(start)
	if code != protocol.ResFlushSlaveTimeout || took < 250*time.Millisecond || took > 5*time.Second {
		t.Fatalf("send to a stalled slave: code %d after %v, want FLUSH_SLAVE_TIMEOUT after ~300ms", code, took)
	}
	if code, _ := sendCode(t, mc, "sync-t", "no wait", props(protocol.PropWaitStoreMsgOK, "false")); code != protocol.ResSuccess {
		t.Fatalf("WAIT=false send to a stalled slave: code %d, want SEND_OK", code)
	}
	if r := pull(t, mc, pullArgs{topic: "sync-t", offset: rh.QueueOffset, max: 1}); len(r.msgs) != 1 || string(r.msgs[0].Body) != "stalled" {
		t.Fatalf("the FLUSH_SLAVE_TIMEOUT message is not stored: %+v", r)
	}
	if hs := m.HAStatus(); hs.SyncTimeouts < 1 || hs.SlaveNotAvailable < 2 {
		t.Fatalf("HA status counts %d timeouts and %d not available", hs.SyncTimeouts, hs.SlaveNotAvailable)
	}
	st.release()
	waitCaughtUp(t, m, s)
	if code, _ := sendCode(t, mc, "sync-t", "released", ""); code != protocol.ResSuccess {
		t.Fatalf("send after the slave caught up: code %d, want SEND_OK", code)
	}
}

// TestBrokerHAAsyncMasterDoesNotWait: an ASYNC_MASTER answers SEND_OK while
// its slave is stalled.
func TestBrokerHAAsyncMasterDoesNotWait(t *testing.T) {
	var st stall
	p := startPair(t, RoleAsyncMaster, nil, []Option{st.option()})
	mc := dial(t, p.master.Addr())
	createTopic(t, mc, "async-t", 1)
	st.hold()
	defer st.release()
	for i := range 5 {
		if code, _ := sendCode(t, mc, "async-t", fmt.Sprint(i), ""); code != protocol.ResSuccess {
			t.Fatalf("send %d: code %d", i, code)
		}
	}
	if lag := p.master.HAStatus().Slaves[0].Lag; lag <= 0 {
		t.Fatalf("the stalled slave's lag is %d", lag)
	}
}

// TestBrokerHASlaveRefusesWrites: a slave refuses sends, batches, send-backs
// (SERVICE_NOT_AVAILABLE) and transaction ends (SLAVE_NOT_AVAILABLE), as a
// Java slave does, and stores none of them.
func TestBrokerHASlaveRefusesWrites(t *testing.T) {
	p := startPair(t, RoleSyncMaster, nil, nil)
	mc := dial(t, p.master.Addr())
	createTopic(t, mc, "ro-t", 1)
	send(t, mc, "ro-t", 0, []byte("one"), "")
	waitCaughtUp(t, p.master, p.slave)
	end := p.slave.HAStatus().LogEnd
	sc := subDial(t, p.slave, "cli")
	for name, c := range map[string]struct {
		req  *protocol.Command
		code int32
	}{
		"send":      {sendReq("ro-t", 0, []byte("x"), ""), protocol.ResServiceNotAvailable},
		"batch":     {batchReq(t, "ro-t", 2, func(int) (int32, []byte, string) { return 0, []byte("b"), "" }), protocol.ResServiceNotAvailable},
		"half":      {txSendReq("pg", "ro-t", 0, "h"), protocol.ResServiceNotAvailable},
		"end":       {endReq("pg", txHalf{phys: 0}, protocol.SysFlagTransactionCommit, false), protocol.ResSlaveNotAvailable},
		"send-back": {sendBackReq("cg", 0, 0), protocol.ResServiceNotAvailable},
		"send v2":   {sendReqV2("ro-t", []byte("x")), protocol.ResServiceNotAvailable},
	} {
		if r := sc.invoke(t, c.req); r.Code != c.code {
			t.Errorf("%s to the slave: code %d %q, want %d", name, r.Code, r.Remark, c.code)
		}
	}
	if got := p.slave.HAStatus().LogEnd; got != end {
		t.Fatalf("the slave's log grew from %d to %d", end, got)
	}
}

func sendBackReq(group string, phys int64, delay int32) *protocol.Command {
	req := protocol.NewRequest(protocol.ReqConsumerSendMsgBack)
	(&protocol.ConsumerSendMsgBackRequestHeader{Offset: phys, Group: group, DelayLevel: delay}).Encode(req)
	return req
}

func sendReqV2(topic string, body []byte) *protocol.Command {
	req := protocol.NewRequest(protocol.ReqSendMessageV2)
	(&protocol.SendMessageRequestHeaderV2{ProducerGroup: "pg", Topic: topic, DefaultTopic: topicDefault,
		DefaultTopicQueueNums: 4, BornTimestamp: time.Now().UnixMilli()}).Encode(req)
	req.Body = body
	return req
}

// logBuffer collects a broker's log for the tests that check what it says.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// TestBrokerHAWrongMasterRefused: a slave pointed at a master of another
// broker name or cluster, or holding another master's log, is refused, and
// both sides say why.
func TestBrokerHAWrongMasterRefused(t *testing.T) {
	var mlog logBuffer
	m := startBroker(t, append([]Option{WithRole(RoleAsyncMaster), WithLogger(mlog.logger())}, fastHA...)...)
	mc := dial(t, m.Addr())
	createTopic(t, mc, "w-t", 1)
	send(t, mc, "w-t", 0, []byte("x"), "")
	haAddr := m.HAStatus().HAAddr

	// A data directory that was another master's.
	other := t.TempDir()
	o := newStartedBroker(t, WithDataDir(other), WithRole(RoleAsyncMaster))
	oc := dial(t, o.Addr())
	createTopic(t, oc, "w-t", 1)
	send(t, oc, "w-t", 0, []byte("other"), "")
	if err := o.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name       string
		opts       []Option
		slaveSays  string
		masterSays string
	}{
		{"another broker name", []Option{WithBrokerName("broker-x")}, `broker "broker-x"`, "broker and cluster names"},
		{"another cluster", []Option{WithClusterName("OtherCluster")}, `cluster "OtherCluster"`, "broker and cluster names"},
		{"another master's log", []Option{WithDataDir(other)}, "another master", "another master"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := startBroker(t, append(append([]Option{WithRole(RoleSlave), WithBrokerID(1), WithMasterHAAddr(haAddr)}, fastHA...), c.opts...)...)
			poll.Until(t, 10*time.Second, 5*time.Millisecond, func() error {
				ml := s.HAStatus().Master
				if ml == nil || !strings.Contains(ml.LastError, c.slaveSays) {
					return fmt.Errorf("slave's last error %+v, want one naming %s", ml, c.slaveSays)
				}
				if !strings.Contains(mlog.String(), c.masterSays) {
					return fmt.Errorf("the master's log does not say %q", c.masterSays)
				}
				return nil
			})
			if n := len(m.HAStatus().Slaves); n != 0 {
				t.Fatalf("the master counts %d slaves", n)
			}
			if end := s.HAStatus().LogEnd; c.name != "another master's log" && end != 0 {
				t.Fatalf("the refused slave got %d bytes of log", end)
			}
		})
	}
}

// TestBrokerHATwoMastersRefused: a second master of a broker name, or a
// slave of it registered in another cluster, fails to start with the name
// server's reason, and the routes keep the first master.
func TestBrokerHATwoMastersRefused(t *testing.T) {
	ns := startNameServer(t)
	m := startBroker(t, WithNameServers(ns.Addr()), WithRole(RoleSyncMaster))
	for _, c := range []struct {
		name string
		opts []Option
		says string
	}{
		{"second master", []Option{WithRole(RoleSyncMaster)}, "already has a master at " + m.AdvertisedAddr()},
		{"slave in another cluster", []Option{WithRole(RoleSlave), WithBrokerID(1), WithClusterName("OtherCluster")}, `registered in cluster "DefaultCluster"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			shortGrace := optionFunc(func(c *config) { c.conflictGrace = 300 * time.Millisecond })
			b, err := New(append([]Option{WithDataDir(t.TempDir()), WithListenAddr("127.0.0.1:0"), WithNameServers(ns.Addr()), shortGrace}, c.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			err = b.Start(ctx)
			if err == nil {
				_ = b.Close()
				t.Fatal("Start succeeded")
			}
			if !errors.Is(err, errRegistrationConflict) || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("Start: %v, want a registration conflict saying %q", err, c.says)
			}
		})
	}
	c := dial(t, ns.Addr())
	ci := invoke(t, c, protocol.NewRequest(protocol.ReqGetBrokerClusterInfo))
	if want := `"0":"` + m.AdvertisedAddr() + `"`; !strings.Contains(string(ci.Body), want) || strings.Contains(string(ci.Body), "OtherCluster") {
		t.Fatalf("cluster info %s", ci.Body)
	}
}

// TestBrokerHAConflictRemarkIsTheNameServers: the broker recognises the
// name server's refusal by its remark.
func TestBrokerHAConflictRemarkIsTheNameServers(t *testing.T) {
	if conflictRemark != namesrv.ConflictRemark {
		t.Fatalf("broker's %q, name server's %q", conflictRemark, namesrv.ConflictRemark)
	}
}
