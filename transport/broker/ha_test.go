package broker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil/poll"
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

var _ = strings.Contains
var _ = context.Background
