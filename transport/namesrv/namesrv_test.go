package namesrv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

func brokerA() *broker {
	return &broker{cluster: "DefaultCluster", name: "broker-a", addr: "127.0.0.1:10911", ha: "127.0.0.1:10912",
		dv:     protocol.DataVersion{Counter: 3, Timestamp: 1700000000000},
		topics: topics(topic("TopicTest", 4, 4, 6), topic("TBW102", 8, 8, 7))}
}

func TestRegisterBrokerAndRoute(t *testing.T) {
	s := startServer(t)
	c := dial(t, s.Addr())
	resp := brokerA().register(t, c)
	if len(resp.Body) != 0 {
		t.Errorf("register response body %q, want none (no ORDER_TOPIC_CONFIG)", resp.Body)
	}
	if v, ok := resp.Ext("masterAddr"); ok {
		t.Errorf("master got masterAddr %q", v)
	}

	r := route(t, c, "TopicTest")
	expectCode(t, r, protocol.ResSuccess)
	checkGolden(t, "route_single.json", r.Body)

	var rd protocol.TopicRouteData
	if err := rd.Decode(r.Body); err != nil {
		t.Fatal(err)
	}
	if len(rd.QueueDatas) != 1 || rd.QueueDatas[0].WriteQueueNums != 4 || rd.QueueDatas[0].Perm != 6 {
		t.Errorf("queue datas %+v", rd.QueueDatas)
	}
	g, err := parseLikeGoClient(r.Body)
	if err != nil {
		t.Fatal(err)
	}
	if got := g.brokers["broker-a"]; len(got) != 1 || got[0] != "127.0.0.1:10911" {
		t.Errorf("Go client would see broker-a addrs %v", got)
	}

	tbw := route(t, c, "TBW102")
	expectCode(t, tbw, protocol.ResSuccess)
	if !strings.Contains(string(tbw.Body), `"perm":7,"readQueueNums":8`) {
		t.Errorf("TBW102 route %s", tbw.Body)
	}
}

func TestRouteUnknownTopic(t *testing.T) {
	s := startServer(t)
	c := dial(t, s.Addr())
	r := route(t, c, "NoSuchTopic")
	expectCode(t, r, protocol.ResTopicNotExist)
	if want := "No topic route info in name server for the topic: NoSuchTopic"; r.Remark != want {
		t.Errorf("remark %q, want %q", r.Remark, want)
	}
	if !errors.Is(protocol.ResponseError(r), protocol.ErrTopicNotExist) {
		t.Errorf("not ErrTopicNotExist")
	}
}

func TestMultiBrokerRoute(t *testing.T) {
	s := startServer(t)
	c := dial(t, s.Addr())
	a := brokerA()
	a.topics = topics(topic("Shared", 4, 4, 6), topic("OnlyA", 2, 2, 6))
	a.register(t, c)
	slave := *a
	slave.id, slave.addr, slave.ha = 1, "127.0.0.2:10911", "127.0.0.2:10912"
	slave.topics = topics(topic("Shared", 4, 4, 6), topic("OnlyA", 2, 2, 6), topic("SlaveOnly", 1, 1, 6))
	resp := slave.register(t, c)
	if v, _ := resp.Ext("masterAddr"); v != a.addr {
		t.Errorf("slave got masterAddr %q, want %q", v, a.addr)
	}
	if v, _ := resp.Ext("haServerAddr"); v != a.ha {
		t.Errorf("slave got haServerAddr %q, want %q", v, a.ha)
	}
	b := &broker{cluster: "DefaultCluster", name: "broker-b", addr: "127.0.0.3:10911", ha: "127.0.0.3:10912",
		topics: topics(topic("Shared", 8, 8, 6), topic("OnlyB", 1, 1, 6))}
	b.register(t, c)

	r := route(t, c, "Shared")
	expectCode(t, r, protocol.ResSuccess)
	checkGolden(t, "route_multi.json", r.Body)
	g, err := parseLikeGoClient(r.Body)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]map[int64]string{
		"broker-a": {0: "127.0.0.1:10911", 1: "127.0.0.2:10911"},
		"broker-b": {0: "127.0.0.3:10911"},
	}
	if fmt.Sprint(g.brokers) != fmt.Sprint(want) {
		t.Errorf("Go client would see %v, want %v", g.brokers, want)
	}
	// A slave's topic table never creates queue data.
	expectCode(t, route(t, c, "SlaveOnly"), protocol.ResTopicNotExist)
}

func TestClusterInfo(t *testing.T) {
	s := startServer(t)
	c := dial(t, s.Addr())
	brokerA().register(t, c)
	b := &broker{cluster: "Other", name: "broker-b", addr: "127.0.0.3:10911", ha: "127.0.0.3:10912",
		topics: topics(topic("T1", 1, 1, 6), topic("T2", 1, 1, 6))}
	b.register(t, c)
	resp := invoke(t, c, protocol.NewRequest(protocol.ReqGetBrokerClusterInfo))
	expectCode(t, resp, protocol.ResSuccess)
	checkGolden(t, "cluster_info.json", resp.Body)
	var ci protocol.ClusterInfo
	if err := ci.Decode(resp.Body); err != nil {
		t.Fatal(err)
	}
	if got := ci.ClusterAddrTable["Other"]; !slices.Equal(got, []string{"broker-b"}) {
		t.Errorf("cluster Other = %v", got)
	}
}

func TestTopicLists(t *testing.T) {
	s := startServer(t)
	c := dial(t, s.Addr())
	brokerA().register(t, c)
	b := &broker{cluster: "Other", name: "broker-b", addr: "127.0.0.3:10911",
		topics: topics(topic("T1", 1, 1, 6), topic("TopicTest", 1, 1, 6))}
	b.register(t, c)

	resp := invoke(t, c, protocol.NewRequest(protocol.ReqGetAllTopicListFromNameServer))
	expectCode(t, resp, protocol.ResSuccess)
	if want := `{"topicList":["T1","TBW102","TopicTest"]}`; string(resp.Body) != want {
		t.Errorf("topic list %s, want %s", resp.Body, want)
	}

	req := protocol.NewRequest(protocol.ReqGetTopicsByCluster)
	(&protocol.GetTopicsByClusterRequestHeader{Cluster: "Other"}).Encode(req)
	resp = invoke(t, c, req)
	expectCode(t, resp, protocol.ResSuccess)
	var tl protocol.TopicList
	if err := tl.Decode(resp.Body); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tl.TopicList, []string{"T1", "TopicTest"}) {
		t.Errorf("topics of Other = %v", tl.TopicList)
	}

	s2 := startServer(t, WithAllTopicList(false))
	c2 := dial(t, s2.Addr())
	resp = invoke(t, c2, protocol.NewRequest(protocol.ReqGetAllTopicListFromNameServer))
	expectCode(t, resp, protocol.ResSystemError)
	if resp.Remark != "disable" {
		t.Errorf("remark %q", resp.Remark)
	}
}

func deleteTopic(t *testing.T, c *remoting.Conn, topic, cluster string) {
	t.Helper()
	req := protocol.NewRequest(protocol.ReqDeleteTopicInNamesrv)
	(&protocol.DeleteTopicFromNamesrvRequestHeader{Topic: topic, ClusterName: cluster}).Encode(req)
	expectCode(t, invoke(t, c, req), protocol.ResSuccess)
}

func TestDeleteTopic(t *testing.T) {
	s := startServer(t)
	c := dial(t, s.Addr())
	a := brokerA()
	a.topics = topics(topic("Shared", 4, 4, 6), topic("Gone", 4, 4, 6))
	a.register(t, c)
	b := &broker{cluster: "Other", name: "broker-b", addr: "127.0.0.3:10911",
		topics: topics(topic("Shared", 2, 2, 6), topic("X", 1, 1, 6))}
	b.register(t, c)

	deleteTopic(t, c, "Gone", "")
	expectCode(t, route(t, c, "Gone"), protocol.ResTopicNotExist)

	deleteTopic(t, c, "Shared", "Other")
	r := route(t, c, "Shared")
	expectCode(t, r, protocol.ResSuccess)
	var rd protocol.TopicRouteData
	if err := rd.Decode(r.Body); err != nil {
		t.Fatal(err)
	}
	if len(rd.QueueDatas) != 1 || rd.QueueDatas[0].BrokerName != "broker-a" || len(rd.BrokerDatas) != 1 {
		t.Errorf("after per-cluster delete: %s", r.Body)
	}
	deleteTopic(t, c, "Shared", "DefaultCluster")
	expectCode(t, route(t, c, "Shared"), protocol.ResTopicNotExist)
	deleteTopic(t, c, "NeverExisted", "")
}

func kvRequest(code int32, ns, key, value string) *protocol.Command {
	req := protocol.NewRequest(code)
	switch code {
	case protocol.ReqPutKVConfig:
		(&protocol.PutKVConfigRequestHeader{Namespace: ns, Key: key, Value: value}).Encode(req)
	case protocol.ReqGetKVConfig:
		(&protocol.GetKVConfigRequestHeader{Namespace: ns, Key: key}).Encode(req)
	case protocol.ReqDeleteKVConfig:
		(&protocol.DeleteKVConfigRequestHeader{Namespace: ns, Key: key}).Encode(req)
	case ReqGetKVListByNamespace:
		req.SetExt("namespace", ns)
	}
	return req
}

func TestKVConfig(t *testing.T) {
	dir := t.TempDir()
	s := startServer(t, WithKVConfigDir(dir), WithOrderMessage(true))
	c := dial(t, s.Addr())

	expectCode(t, invoke(t, c, kvRequest(protocol.ReqGetKVConfig, "ns", "k", "")), protocol.ResQueryNotFound)
	expectCode(t, invoke(t, c, kvRequest(protocol.ReqPutKVConfig, "ns", "k", "v1")), protocol.ResSuccess)
	resp := invoke(t, c, kvRequest(protocol.ReqGetKVConfig, "ns", "k", ""))
	expectCode(t, resp, protocol.ResSuccess)
	if v, _ := resp.Ext("value"); v != "v1" {
		t.Errorf("value %q", v)
	}
	expectCode(t, invoke(t, c, kvRequest(protocol.ReqPutKVConfig, NamespaceOrderTopicConfig, "TopicTest", "broker-a:4")), protocol.ResSuccess)

	resp = invoke(t, c, kvRequest(ReqGetKVListByNamespace, NamespaceOrderTopicConfig, "", ""))
	expectCode(t, resp, protocol.ResSuccess)
	if want := `{"table":{"TopicTest":"broker-a:4"}}`; string(resp.Body) != want {
		t.Errorf("kv list %s, want %s", resp.Body, want)
	}

	// The register response carries ORDER_TOPIC_CONFIG, and routes carry
	// orderTopicConf with WithOrderMessage.
	resp = brokerA().register(t, c)
	var kt protocol.KVTable
	if err := kt.Decode(resp.Body); err != nil || kt.Table["TopicTest"] != "broker-a:4" {
		t.Errorf("register response body %q (%v)", resp.Body, err)
	}
	r := route(t, c, "TopicTest")
	expectCode(t, r, protocol.ResSuccess)
	g, err := parseLikeGoClient(r.Body)
	if err != nil {
		t.Fatal(err)
	}
	if g.orderTopicConf != "broker-a:4" {
		t.Errorf("orderTopicConf %q in %s", g.orderTopicConf, r.Body)
	}

	expectCode(t, invoke(t, c, kvRequest(protocol.ReqDeleteKVConfig, "ns", "k", "")), protocol.ResSuccess)
	expectCode(t, invoke(t, c, kvRequest(protocol.ReqGetKVConfig, "ns", "k", "")), protocol.ResQueryNotFound)
	expectCode(t, invoke(t, c, kvRequest(ReqGetKVListByNamespace, "ns", "", "")), protocol.ResQueryNotFound)

	// Persisted in Java's format, and loaded by a new server.
	b, err := os.ReadFile(filepath.Join(dir, "kvConfig.json"))
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"configTable":{"ORDER_TOPIC_CONFIG":{"TopicTest":"broker-a:4"}}}`; string(b) != want {
		t.Errorf("kvConfig.json %s, want %s", b, want)
	}
	s2 := startServer(t, WithKVConfigDir(dir))
	c2 := dial(t, s2.Addr())
	resp = invoke(t, c2, kvRequest(protocol.ReqGetKVConfig, NamespaceOrderTopicConfig, "TopicTest", ""))
	expectCode(t, resp, protocol.ResSuccess)
	if v, _ := resp.Ext("value"); v != "broker-a:4" {
		t.Errorf("reloaded value %q", v)
	}
}

func TestKVConfigCorruptFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "kvConfig.json"), []byte(`{"configTable":`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := New(WithKVConfigDir(dir)); err == nil {
		t.Fatal("New accepted a corrupt KV config file")
	}
}

func TestRegisterOldVersionBody(t *testing.T) {
	s := startServer(t)
	c := dial(t, s.Addr())
	w := protocol.TopicConfigSerializeWrapper{DataVersion: protocol.DataVersion{Counter: 1, Timestamp: 5},
		TopicConfigTable: topics(topic("Old1", 2, 2, 6), topic("Old2", 2, 2, 6))}
	body, err := w.Encode()
	if err != nil {
		t.Fatal(err)
	}
	req := protocol.NewRequest(protocol.ReqRegisterBroker)
	(&protocol.RegisterBrokerRequestHeader{BrokerName: "old", BrokerAddr: "127.0.0.9:10911", ClusterName: "C",
		HAServerAddr: "127.0.0.9:10912"}).Encode(req)
	req.Version = 30 // before V3_0_11: a bare TopicConfigSerializeWrapper
	req.Body = body
	expectCode(t, invoke(t, c, req), protocol.ResSuccess)
	expectCode(t, route(t, c, "Old1"), protocol.ResSuccess)

	// The same bytes from a new broker are a RegisterBrokerBody with no
	// topicConfigSerializeWrapper: a registration without topics.
	req2 := protocol.NewRequest(protocol.ReqRegisterBroker)
	(&protocol.RegisterBrokerRequestHeader{BrokerName: "new", BrokerAddr: "127.0.0.8:10911", ClusterName: "C",
		HAServerAddr: "x"}).Encode(req2)
	req2.Body = body
	expectCode(t, invoke(t, c, req2), protocol.ResSuccess)
	resp := invoke(t, c, protocol.NewRequest(protocol.ReqGetBrokerClusterInfo))
	if !strings.Contains(string(resp.Body), `"new"`) {
		t.Errorf("broker new missing from %s", resp.Body)
	}
}

func TestRegisterCompressedBody(t *testing.T) {
	s := startServer(t)
	c := dial(t, s.Addr())
	body := protocol.RegisterBrokerBody{TopicConfigSerializeWrapper: protocol.TopicConfigSerializeWrapper{
		TopicConfigTable: topics(topic("Z1", 3, 3, 6), topic("Z2", 3, 3, 6))}}
	raw, err := body.EncodeCompressed()
	if err != nil {
		t.Fatal(err)
	}
	req := protocol.NewRequest(protocol.ReqRegisterBroker)
	(&protocol.RegisterBrokerRequestHeader{BrokerName: "z", BrokerAddr: "127.0.0.7:10911", ClusterName: "C",
		HAServerAddr: "x", Compressed: protocol.Some(true)}).Encode(req)
	req.Body = raw
	expectCode(t, invoke(t, c, req), protocol.ResSuccess)
	r := route(t, c, "Z2")
	expectCode(t, r, protocol.ResSuccess)
	if !strings.Contains(string(r.Body), `"readQueueNums":3`) {
		t.Errorf("route %s", r.Body)
	}
}

func TestRegisterCRC(t *testing.T) {
	s := startServer(t)
	c := dial(t, s.Addr())
	req := brokerA().registerRequest(t)
	req.Body = append([]byte(nil), req.Body...)
	req.Body[len(req.Body)-2] ^= 1 // still a valid shape for the crc, wrong content
	resp := invoke(t, c, req)
	expectCode(t, resp, protocol.ResSystemError)
	if resp.Remark != "crc32 not match" {
		t.Errorf("remark %q", resp.Remark)
	}
	expectCode(t, route(t, c, "TopicTest"), protocol.ResTopicNotExist)

	// bodyCrc32 0 means unchecked.
	req = brokerA().registerRequest(t)
	req.SetExt("bodyCrc32", "0")
	expectCode(t, invoke(t, c, req), protocol.ResSuccess)
}

func TestFirstRegistrationWithOneTopicRejected(t *testing.T) {
	s := startServer(t)
	c := dial(t, s.Addr())
	one := brokerA()
	one.topics = topics(topic("Lonely", 4, 4, 6))
	resp := invoke(t, c, one.registerRequest(t))
	expectCode(t, resp, protocol.ResSystemError)
	if resp.Remark != "register broker failed" {
		t.Errorf("remark %q", resp.Remark)
	}
	// Nothing was left behind.
	ci := invoke(t, c, protocol.NewRequest(protocol.ReqGetBrokerClusterInfo))
	if want := `{"brokerAddrTable":{},"clusterAddrTable":{}}`; string(ci.Body) != want {
		t.Errorf("cluster info after rejection %s", ci.Body)
	}
	// An empty first registration, then one topic, is fine.
	empty := brokerA()
	empty.topics = nil
	empty.register(t, c)
	one.register(t, c)
	expectCode(t, route(t, c, "Lonely"), protocol.ResSuccess)
}

func TestUnregisterBroker(t *testing.T) {
	s := startServer(t)
	c := dial(t, s.Addr())
	a := brokerA()
	a.register(t, c)
	slave := *a
	slave.id, slave.addr = 1, "127.0.0.2:10911"
	slave.register(t, c)

	unreg := func(b *broker) {
		req := protocol.NewRequest(protocol.ReqUnregisterBroker)
		(&protocol.UnRegisterBrokerRequestHeader{BrokerName: b.name, BrokerAddr: b.addr, ClusterName: b.cluster, BrokerID: b.id}).Encode(req)
		expectCode(t, invoke(t, c, req), protocol.ResSuccess)
	}
	unreg(a)
	r := route(t, c, "TopicTest")
	expectCode(t, r, protocol.ResSuccess) // the slave keeps the group alive
	if want := `"brokerAddrs":{"1":"127.0.0.2:10911"}`; !strings.Contains(string(r.Body), want) {
		t.Errorf("route %s lacks %s", r.Body, want)
	}
	unreg(&slave)
	expectCode(t, route(t, c, "TopicTest"), protocol.ResTopicNotExist)
	ci := invoke(t, c, protocol.NewRequest(protocol.ReqGetBrokerClusterInfo))
	if want := `{"brokerAddrTable":{},"clusterAddrTable":{}}`; string(ci.Body) != want {
		t.Errorf("cluster info %s", ci.Body)
	}
}

func TestEvictByTimeout(t *testing.T) {
	clk := newFakeClock()
	s := startServer(t, WithClock(clk.Now), WithScanInterval(5*time.Millisecond))
	c := dial(t, s.Addr())
	ac, bc := dial(t, s.Addr()), dial(t, s.Addr())
	a := brokerA()
	a.register(t, ac)
	b := &broker{cluster: "DefaultCluster", name: "broker-b", addr: "127.0.0.3:10911", timeoutMillis: 300_000,
		topics: topics(topic("TopicTest", 2, 2, 6), topic("OnlyB", 2, 2, 6))}
	b.register(t, bc)

	clk.Advance(DefaultBrokerExpiry) // not yet: expiry needs lastUpdate + timeout < now
	s.scan()
	expectCode(t, route(t, c, "TBW102"), protocol.ResSuccess)

	clk.Advance(time.Millisecond)
	waitFor(t, 5*time.Second, func() error {
		if r := route(t, c, "TBW102"); r.Code != protocol.ResTopicNotExist {
			return fmt.Errorf("TBW102 still routed (code %d)", r.Code)
		}
		return nil
	})
	// broker-b asked for 300 s and is still there.
	r := route(t, c, "TopicTest")
	expectCode(t, r, protocol.ResSuccess)
	if strings.Contains(string(r.Body), "broker-a") || !strings.Contains(string(r.Body), "broker-b") {
		t.Errorf("route after broker-a expired: %s", r.Body)
	}
	// Java closes an expired broker's channel: so does runnel.
	waitFor(t, 5*time.Second, func() error {
		select {
		case <-ac.Done():
			return nil
		default:
			return errors.New("connection of the expired broker still open")
		}
	})
	select {
	case <-bc.Done():
		t.Error("connection of the live broker closed")
	default:
	}
	clk.Advance(300 * time.Second)
	waitFor(t, 5*time.Second, func() error {
		if r := route(t, c, "OnlyB"); r.Code != protocol.ResTopicNotExist {
			return fmt.Errorf("OnlyB still routed (code %d)", r.Code)
		}
		return nil
	})
}

func TestEvictOnDisconnect(t *testing.T) {
	s := startServer(t)
	admin := dial(t, s.Addr())
	bc := dial(t, s.Addr())
	brokerA().register(t, bc)

	// A broker that reconnected is not evicted by its old connection.
	b := &broker{cluster: "DefaultCluster", name: "broker-b", addr: "127.0.0.3:10911",
		topics: topics(topic("B1", 1, 1, 6), topic("B2", 1, 1, 6))}
	old := dial(t, s.Addr())
	b.register(t, old)
	b.register(t, dial(t, s.Addr()))
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}

	expectCode(t, route(t, admin, "TopicTest"), protocol.ResSuccess)
	if err := bc.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, func() error {
		if r := route(t, admin, "TopicTest"); r.Code != protocol.ResTopicNotExist {
			return fmt.Errorf("TopicTest still routed (code %d)", r.Code)
		}
		return nil
	})
	expectCode(t, route(t, admin, "B1"), protocol.ResSuccess)
}

func TestSeveralNameServers(t *testing.T) {
	s1, s2 := startServer(t), startServer(t)
	c1, c2 := dial(t, s1.Addr()), dial(t, s2.Addr())
	a := brokerA()
	a.register(t, c1)
	a.register(t, c2)
	r1, r2 := route(t, c1, "TopicTest"), route(t, c2, "TopicTest")
	expectCode(t, r1, protocol.ResSuccess)
	expectCode(t, r2, protocol.ResSuccess)
	if string(r1.Body) != string(r2.Body) {
		t.Errorf("name servers disagree:\n%s\n%s", r1.Body, r2.Body)
	}
	// They are independent: closing the connection to one evicts there only.
	if err := c1.Close(); err != nil {
		t.Fatal(err)
	}
	c1b := dial(t, s1.Addr())
	waitFor(t, 5*time.Second, func() error {
		if r := route(t, c1b, "TopicTest"); r.Code != protocol.ResTopicNotExist {
			return errors.New("still routed by s1")
		}
		return nil
	})
	expectCode(t, route(t, c2, "TopicTest"), protocol.ResSuccess)
}

func TestWritePerm(t *testing.T) {
	s := startServer(t)
	c := dial(t, s.Addr())
	brokerA().register(t, c)
	perm := func(code int32) *protocol.Command {
		req := protocol.NewRequest(code)
		(&protocol.WipeWritePermOfBrokerRequestHeader{BrokerName: "broker-a"}).Encode(req)
		resp := invoke(t, c, req)
		expectCode(t, resp, protocol.ResSuccess)
		return resp
	}
	resp := perm(protocol.ReqWipeWritePermOfBroker)
	var wh protocol.WipeWritePermOfBrokerResponseHeader
	if err := wh.Decode(resp); err != nil || wh.WipeTopicCount != 2 {
		t.Errorf("wipeTopicCount %d (%v)", wh.WipeTopicCount, err)
	}
	if r := route(t, c, "TBW102"); !strings.Contains(string(r.Body), `"perm":5`) {
		t.Errorf("after wipe: %s", r.Body)
	}
	resp = perm(ReqAddWritePermOfBroker)
	if v, _ := resp.Ext("addTopicCount"); v != "2" {
		t.Errorf("addTopicCount %q", v)
	}
	if r := route(t, c, "TBW102"); !strings.Contains(string(r.Body), `"perm":6`) {
		t.Errorf("after add: %s", r.Body)
	}
}

func TestRegisterTopicInNamesrv(t *testing.T) {
	s := startServer(t)
	c := dial(t, s.Addr())
	brokerA().register(t, c)
	reg := func(brokerName string) *protocol.Command {
		rd := protocol.TopicRouteData{QueueDatas: []protocol.QueueData{{BrokerName: brokerName, ReadQueueNums: 2, WriteQueueNums: 2, Perm: 6}}}
		req := protocol.NewRequest(protocol.ReqRegisterTopicInNamesrv)
		(&protocol.RegisterTopicRequestHeader{Topic: "Admin"}).Encode(req)
		req.Body, _ = rd.Encode()
		return invoke(t, c, req)
	}
	expectCode(t, reg("no-such-broker"), protocol.ResSystemError)
	expectCode(t, route(t, c, "Admin"), protocol.ResTopicNotExist)
	expectCode(t, reg("broker-a"), protocol.ResSuccess)
	expectCode(t, route(t, c, "Admin"), protocol.ResSuccess)
}

func TestQueryDataVersion(t *testing.T) {
	clk := newFakeClock()
	s := startServer(t, WithClock(clk.Now), WithScanInterval(time.Hour))
	c := dial(t, s.Addr())
	a := brokerA()
	a.register(t, c)
	query := func(dv protocol.DataVersion) *protocol.Command {
		req := protocol.NewRequest(protocol.ReqQueryDataVersion)
		(&protocol.QueryDataVersionRequestHeader{BrokerName: a.name, BrokerAddr: a.addr, ClusterName: a.cluster}).Encode(req)
		req.Body, _ = json.Marshal(dv)
		resp := invoke(t, c, req)
		expectCode(t, resp, protocol.ResSuccess)
		return resp
	}
	resp := query(a.dv)
	if v, _ := resp.Ext("changed"); v != "false" {
		t.Errorf("changed %q for the registered version", v)
	}
	if want := `{"counter":3,"stateVersion":0,"timestamp":1700000000000}`; string(resp.Body) != want {
		t.Errorf("body %s, want %s", resp.Body, want)
	}
	// The query refreshes liveness.
	clk.Advance(100 * time.Second)
	resp = query(protocol.DataVersion{Counter: 4})
	if v, _ := resp.Ext("changed"); v != "true" {
		t.Errorf("changed %q for a new version", v)
	}
	clk.Advance(100 * time.Second)
	s.scan()
	expectCode(t, route(t, c, "TopicTest"), protocol.ResSuccess)
}

func TestRefusedAndUnknownRequests(t *testing.T) {
	s := startServer(t)
	c := dial(t, s.Addr())
	req := protocol.NewRequest(ReqUpdateNamesrvConfig)
	req.Body = []byte("configStorePath=/tmp/x\n")
	resp := invoke(t, c, req)
	expectCode(t, resp, protocol.ResNoPermission)
	if !strings.Contains(resp.Remark, "never accepted") {
		t.Errorf("remark %q", resp.Remark)
	}
	resp = invoke(t, c, protocol.NewRequest(ReqGetNamesrvConfig))
	expectCode(t, resp, protocol.ResSuccess)
	if !strings.Contains(string(resp.Body), "enableAllTopicList=true\n") {
		t.Errorf("config body %q", resp.Body)
	}
	expectCode(t, invoke(t, c, protocol.NewRequest(protocol.ReqSendMessage)), protocol.ResRequestCodeNotSupported)
}

func TestBadInput(t *testing.T) {
	s := startServer(t)
	c := dial(t, s.Addr())
	cases := []struct {
		name   string
		req    func() *protocol.Command
		remark string
	}{
		{"register without brokerName", func() *protocol.Command {
			req := brokerA().registerRequest(t)
			req.DeleteExt("brokerName")
			return req
		}, `"brokerName"`},
		{"register with bad brokerId", func() *protocol.Command {
			req := brokerA().registerRequest(t)
			req.SetExt("brokerId", "zero")
			return req
		}, `"brokerId"`},
		{"register with negative brokerId", func() *protocol.Command {
			req := brokerA().registerRequest(t)
			req.SetExt("brokerId", "-1")
			return req
		}, "negative brokerId"},
		{"register with garbage body", func() *protocol.Command {
			req := brokerA().registerRequest(t)
			req.DeleteExt("bodyCrc32")
			req.Body = []byte(`{"topicConfigSerializeWrapper":{"topicConfigTable":[1,2]`)
			return req
		}, "invalid JSON body"},
		{"register with huge queue count", func() *protocol.Command {
			b := brokerA()
			b.topics = topics(topic("Big", 1<<20, 4, 6), topic("Other", 1, 1, 6))
			return b.registerRequest(t)
		}, "queue counts"},
		{"register with bad compressed body", func() *protocol.Command {
			req := brokerA().registerRequest(t)
			req.DeleteExt("bodyCrc32")
			req.SetExt("compressed", "true")
			return req
		}, "register broker"},
		{"register with an address the Go client would misparse", func() *protocol.Command {
			req := brokerA().registerRequest(t)
			req.SetExt("brokerAddr", "127.0.0.1:10911,127.0.0.2:10911")
			return req
		}, "not a plain host:port"},
		{"route without topic", func() *protocol.Command { return protocol.NewRequest(protocol.ReqGetRouteInfoByTopic) }, `"topic"`},
		{"kv put without value", func() *protocol.Command {
			req := kvRequest(protocol.ReqPutKVConfig, "ns", "k", "v")
			req.DeleteExt("value")
			return req
		}, `"value"`},
		{"query data version with bad body", func() *protocol.Command {
			req := protocol.NewRequest(protocol.ReqQueryDataVersion)
			(&protocol.QueryDataVersionRequestHeader{BrokerName: "b", BrokerAddr: "a", ClusterName: "c"}).Encode(req)
			req.Body = []byte("{nope")
			return req
		}, "query data version"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := invoke(t, c, tc.req())
			expectCode(t, resp, protocol.ResSystemError)
			if !strings.Contains(resp.Remark, tc.remark) {
				t.Errorf("remark %q lacks %q", resp.Remark, tc.remark)
			}
		})
	}
	// Still serving, on the same connection.
	brokerA().register(t, c)
	expectCode(t, route(t, c, "TopicTest"), protocol.ResSuccess)
	expectCode(t, route(t, c, "Big"), protocol.ResTopicNotExist)
}

func TestLifecycle(t *testing.T) {
	if _, err := New(WithBrokerExpiry(0)); err == nil {
		t.Error("New accepted a zero broker expiry")
	}
	if _, err := New(WithScanInterval(-time.Second)); err == nil {
		t.Error("New accepted a negative scan interval")
	}
	s, err := New(WithListenAddr("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Addr() != "" {
		t.Errorf("Addr before Start = %q", s.Addr())
	}
	ctx := context.Background()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(s.Start(ctx), ErrAlreadyStarted) {
		t.Error("second Start did not fail")
	}
	c := dial(t, s.Addr())
	brokerA().register(t, c)
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := s.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(s.Start(ctx), ErrServerClosed) {
		t.Error("Start after Close did not fail")
	}
	// Never started: Close still works.
	s2, err := New()
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestGoClientParseRulesRejectWhitespace shows that the [G] emulation does
// catch the whitespace hazard it guards against.
func TestGoClientParseRulesRejectWhitespace(t *testing.T) {
	spaced := `{"brokerDatas":[{"brokerAddrs":{"0": "127.0.0.1:10911", "1": "127.0.0.2:10911"},"brokerName":"b","cluster":"c"}],"queueDatas":[]}`
	g, err := parseLikeGoClient([]byte(spaced))
	if err != nil {
		t.Fatal(err)
	}
	want := map[int64]string{0: "127.0.0.1:10911", 1: "127.0.0.2:10911"}
	if maps.Equal(g.brokers["b"], want) {
		t.Fatal("the emulation does not reproduce the Go client's whitespace bug")
	}
}

// TestRouteMatchesProtocolDoc registers the broker group of the protocol
// reference's §5.1 example and expects its "standard form" byte for byte.
func TestRouteMatchesProtocolDoc(t *testing.T) {
	s := startServer(t)
	c := dial(t, s.Addr())
	m := &broker{cluster: "DefaultCluster", name: "broker-a", addr: "10.0.0.5:10911", ha: "10.0.0.5:10912",
		topics: topics(topic("TopicTest", 4, 4, 6), topic("TBW102", 8, 8, 7))}
	m.register(t, c)
	sl := *m
	sl.id, sl.addr = 1, "10.0.0.6:10911"
	sl.register(t, c)
	r := route(t, c, "TopicTest")
	expectCode(t, r, protocol.ResSuccess)
	const want = `{"brokerDatas":[{"brokerAddrs":{"0":"10.0.0.5:10911","1":"10.0.0.6:10911"},"brokerName":"broker-a","cluster":"DefaultCluster","enableActingMaster":false}],"filterServerTable":{},"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4}]}`
	if string(r.Body) != want {
		t.Fatalf("route\n got %s\nwant %s", r.Body, want)
	}
}
