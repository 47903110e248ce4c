package namesrv

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// Limits checked on every registration.
const (
	// MaxTopicNameLen bounds a registered topic name, in bytes. Java limits
	// topics to 127 characters and groups to 255; retry and DLQ topics add a
	// prefix to a group name, so this leaves room for both.
	MaxTopicNameLen = 512
	// MaxQueueNums bounds a registered topic's read and write queue counts.
	MaxQueueNums = 1 << 16
)

// brokerKey identifies one registered broker address (Java BrokerAddrInfo).
type brokerKey struct{ cluster, addr string }

// liveInfo is one registered broker address (Java BrokerLiveInfo).
type liveInfo struct {
	brokerName   string
	lastUpdate   time.Time
	timeout      time.Duration
	dataVersion  protocol.DataVersion
	haServerAddr string
	conn         *remoting.ServerConn // the connection it last registered on; nil if unknown
}

// brokerGroup is one broker name: a master and its slaves (Java BrokerData).
type brokerGroup struct {
	cluster      string
	name         string
	zone         string
	actingMaster bool
	addrs        map[int64]string
}

func (g *brokerGroup) data() protocol.BrokerData {
	return protocol.BrokerData{Cluster: g.cluster, BrokerName: g.name, BrokerAddrs: g.addrs,
		ZoneName: g.zone, EnableActingMaster: g.actingMaster}
}

// registration is a decoded REGISTER_BROKER request.
type registration struct {
	cluster, name, addr, haAddr, zone string
	id                                int64
	actingMaster                      bool
	timeout                           time.Duration
	dataVersion                       protocol.DataVersion
	topics                            []protocol.TopicConfig
	filterServers                     []string
	conn                              *remoting.ServerConn
}

// registerResult is what a registration answers.
type registerResult struct {
	conflict     string // why it contradicts a live broker's registration ("" when it does not)
	rejected     bool   // first registration with exactly one topic
	ignored      bool   // an address with a newer state version holds this id
	first        bool   // the address was not registered before
	masterAddr   string
	haServerAddr string
}

// evicted describes one broker address removed by expiry or disconnect.
type evicted struct {
	key        brokerKey
	brokerName string
	conn       *remoting.ServerConn
}

// routeTable is the name server's route state (Java RouteInfoManager). All
// of it is guarded by mu; methods lock it themselves and never call out
// while holding it.
type routeTable struct {
	mu struct {
		sync.Mutex
		topics        map[string]map[string]protocol.QueueData // topic → broker name → queues
		brokers       map[string]*brokerGroup                  // broker name → group
		clusters      map[string]map[string]struct{}           // cluster → broker names
		live          map[brokerKey]*liveInfo
		filterServers map[brokerKey][]string
	}
}

func newRouteTable() *routeTable {
	rt := &routeTable{}
	rt.mu.topics = make(map[string]map[string]protocol.QueueData)
	rt.mu.brokers = make(map[string]*brokerGroup)
	rt.mu.clusters = make(map[string]map[string]struct{})
	rt.mu.live = make(map[brokerKey]*liveInfo)
	rt.mu.filterServers = make(map[brokerKey][]string)
	return rt
}

// register applies a REGISTER_BROKER (Java RouteInfoManager.registerBroker).
func (rt *routeTable) register(r *registration, now time.Time) registerResult {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	key := brokerKey{r.cluster, r.addr}
	g := rt.mu.brokers[r.name]

	// The first registration of a broker id must carry its full topic table
	// (Java rejects exactly one topic). Checked before any change so that a
	// rejected registration leaves nothing behind.
	if _, known := g.addrOf(r.id); !known && len(r.topics) == 1 {
		return registerResult{rejected: true}
	}
	if why := rt.conflictLocked(g, r); why != "" {
		return registerResult{conflict: why}
	}

	names := rt.mu.clusters[r.cluster]
	if names == nil {
		names = make(map[string]struct{})
		rt.mu.clusters[r.cluster] = names
	}
	names[r.name] = struct{}{}
	first := false
	if g == nil {
		g = &brokerGroup{cluster: r.cluster, name: r.name, addrs: make(map[int64]string)}
		rt.mu.brokers[r.name] = g
		first = true
	}
	g.actingMaster = r.actingMaster
	g.zone = r.zone

	// One address holds one id: a slave switched to master drops its old id.
	for id, a := range g.addrs {
		if a == r.addr && id != r.id {
			delete(g.addrs, id)
		}
	}
	// Another address holding this id with a newer state version wins.
	if old, ok := g.addrs[r.id]; ok && old != r.addr {
		if oi := rt.mu.live[brokerKey{r.cluster, old}]; oi != nil && oi.dataVersion.StateVersion > r.dataVersion.StateVersion {
			delete(rt.mu.live, key)
			return registerResult{ignored: true}
		}
	}
	old := g.addrs[r.id]
	g.addrs[r.id] = r.addr
	first = first || old == ""

	if r.id == protocol.MasterID {
		prev := rt.mu.live[key]
		versionChanged := prev == nil || prev.dataVersion != r.dataVersion
		for i := range r.topics {
			tc := &r.topics[i]
			byBroker := rt.mu.topics[tc.TopicName]
			if _, had := byBroker[r.name]; first || versionChanged || !had {
				if byBroker == nil {
					byBroker = make(map[string]protocol.QueueData)
					rt.mu.topics[tc.TopicName] = byBroker
				}
				byBroker[r.name] = protocol.QueueData{BrokerName: r.name, ReadQueueNums: tc.ReadQueueNums,
					WriteQueueNums: tc.WriteQueueNums, Perm: tc.Perm, TopicSysFlag: tc.TopicSysFlag}
			}
		}
	}

	_, wasLive := rt.mu.live[key]
	rt.mu.live[key] = &liveInfo{brokerName: r.name, lastUpdate: now, timeout: r.timeout,
		dataVersion: r.dataVersion, haServerAddr: r.haAddr, conn: r.conn}
	if len(r.filterServers) > 0 {
		rt.mu.filterServers[key] = slices.Clone(r.filterServers)
	} else {
		delete(rt.mu.filterServers, key)
	}

	res := registerResult{first: !wasLive}
	if r.id != protocol.MasterID {
		if m, ok := g.addrs[protocol.MasterID]; ok {
			if mi := rt.mu.live[brokerKey{r.cluster, m}]; mi != nil {
				res.masterAddr, res.haServerAddr = m, mi.haServerAddr
			}
		}
	}
	return res
}

// conflictLocked says why r contradicts a live registration of its broker
// group g (nil for a new one), or "": a broker name registered in another
// cluster, or a second master of a broker name (another address holding id
// 0 while it is live). Java's name server takes either (the newer state
// version's master wins); runnel refuses both, so that two masters of one
// name, or a slave pointed at another cluster's broker of its name, are
// seen at once on both sides.
func (rt *routeTable) conflictLocked(g *brokerGroup, r *registration) string {
	if g == nil {
		return ""
	}
	liveAddr := func(cluster string, id int64) (string, bool) {
		a, ok := g.addrs[id]
		if !ok || a == r.addr {
			return "", false
		}
		return a, rt.mu.live[brokerKey{cluster, a}] != nil
	}
	if g.cluster != r.cluster {
		for id, a := range g.addrs {
			if a != r.addr && rt.mu.live[brokerKey{g.cluster, a}] != nil {
				return fmt.Sprintf("broker name %q is registered in cluster %q (id %d at %s): %s cannot register it in cluster %q",
					g.name, g.cluster, id, a, r.addr, r.cluster)
			}
		}
		return ""
	}
	if r.id == protocol.MasterID {
		if a, live := liveAddr(r.cluster, protocol.MasterID); live {
			return fmt.Sprintf("broker %q of cluster %q already has a master at %s: a second master at %s is refused (give it another broker name, or make it a slave with a broker id above 0)",
				g.name, g.cluster, a, r.addr)
		}
	}
	return ""
}

// addrOf returns the address registered for id; g may be nil.
func (g *brokerGroup) addrOf(id int64) (string, bool) {
	if g == nil {
		return "", false
	}
	a, ok := g.addrs[id]
	return a, ok
}

// unregister removes one broker address (UNREGISTER_BROKER). It reports
// whether anything was registered under it.
func (rt *routeTable) unregister(cluster, addr, brokerName string) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.unregisterLocked(brokerKey{cluster, addr}, brokerName)
}

// unregisterLocked removes the live entry of key and the address from
// broker group brokerName; when the group has no address left it removes the
// group, its cluster membership and its queue data (Java unRegisterBroker
// plus cleanTopicByUnRegisterRequests).
func (rt *routeTable) unregisterLocked(key brokerKey, brokerName string) bool {
	_, wasLive := rt.mu.live[key]
	delete(rt.mu.live, key)
	delete(rt.mu.filterServers, key)
	g := rt.mu.brokers[brokerName]
	if g == nil {
		return wasLive
	}
	removed := false
	for id, a := range g.addrs {
		if a == key.addr {
			delete(g.addrs, id)
			removed = true
		}
	}
	if len(g.addrs) > 0 {
		return wasLive || removed
	}
	delete(rt.mu.brokers, brokerName)
	if names := rt.mu.clusters[g.cluster]; names != nil {
		delete(names, brokerName)
		if len(names) == 0 {
			delete(rt.mu.clusters, g.cluster)
		}
	}
	for topic, byBroker := range rt.mu.topics {
		delete(byBroker, brokerName)
		if len(byBroker) == 0 {
			delete(rt.mu.topics, topic)
		}
	}
	return true
}

// evictConn removes every address last registered on conn.
func (rt *routeTable) evictConn(conn *remoting.ServerConn) []evicted {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	var out []evicted
	for key, li := range rt.mu.live {
		if li.conn == conn {
			out = append(out, evicted{key: key, brokerName: li.brokerName})
		}
	}
	for _, e := range out {
		rt.unregisterLocked(e.key, e.brokerName)
	}
	return out
}

// evictExpired removes every address whose registration is older than its
// timeout at now (Java scanNotActiveBroker: lastUpdate + timeout < now).
func (rt *routeTable) evictExpired(now time.Time) []evicted {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	var out []evicted
	for key, li := range rt.mu.live {
		if li.lastUpdate.Add(li.timeout).Before(now) {
			out = append(out, evicted{key: key, brokerName: li.brokerName, conn: li.conn})
		}
	}
	for _, e := range out {
		rt.unregisterLocked(e.key, e.brokerName)
	}
	return out
}

// appendRoute appends the route of topic as JSON to dst (Java
// pickupTopicRouteData). It reports false when the topic has no queue data
// or none of its brokers is registered.
func (rt *routeTable) appendRoute(dst []byte, topic, orderConf string) ([]byte, bool) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	byBroker := rt.mu.topics[topic]
	if len(byBroker) == 0 {
		return dst, false
	}
	route := protocol.TopicRouteData{
		OrderTopicConf: orderConf,
		QueueDatas:     make([]protocol.QueueData, 0, len(byBroker)),
		BrokerDatas:    make([]protocol.BrokerData, 0, len(byBroker)),
	}
	for _, name := range slices.Sorted(maps.Keys(byBroker)) {
		route.QueueDatas = append(route.QueueDatas, byBroker[name])
		g := rt.mu.brokers[name]
		if g == nil {
			continue
		}
		// The maps are encoded before the lock is released, so they need no copy.
		route.BrokerDatas = append(route.BrokerDatas, g.data())
		for _, a := range g.addrs {
			if fs := rt.mu.filterServers[brokerKey{g.cluster, a}]; len(fs) > 0 {
				if route.FilterServerTable == nil {
					route.FilterServerTable = make(map[string][]string)
				}
				route.FilterServerTable[a] = fs
			}
		}
	}
	if len(route.BrokerDatas) == 0 {
		return dst, false
	}
	return route.AppendTo(dst), true
}

// clusterInfo returns the GET_BROKER_CLUSTER_INFO body.
func (rt *routeTable) clusterInfo() ([]byte, error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	ci := protocol.ClusterInfo{
		BrokerAddrTable:  make(map[string]protocol.BrokerData, len(rt.mu.brokers)),
		ClusterAddrTable: make(map[string][]string, len(rt.mu.clusters)),
	}
	for name, g := range rt.mu.brokers {
		ci.BrokerAddrTable[name] = g.data()
	}
	for c, names := range rt.mu.clusters {
		ci.ClusterAddrTable[c] = slices.Sorted(maps.Keys(names))
	}
	return ci.Encode()
}

// topicList returns every topic with queue data, sorted.
func (rt *routeTable) topicList() []string {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return slices.Sorted(maps.Keys(rt.mu.topics))
}

// topicsByCluster returns the topics with queue data on a broker of cluster.
func (rt *routeTable) topicsByCluster(cluster string) []string {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	names := rt.mu.clusters[cluster]
	out := []string{}
	for topic, byBroker := range rt.mu.topics {
		for name := range names {
			if _, ok := byBroker[name]; ok {
				out = append(out, topic)
				break
			}
		}
	}
	slices.Sort(out)
	return out
}

// deleteTopic removes topic, or when cluster is not empty only the queue
// data of that cluster's brokers. It reports whether anything was removed.
func (rt *routeTable) deleteTopic(topic, cluster string) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	byBroker, ok := rt.mu.topics[topic]
	if !ok {
		return false
	}
	if cluster == "" {
		delete(rt.mu.topics, topic)
		return true
	}
	removed := false
	for name := range rt.mu.clusters[cluster] {
		if _, ok := byBroker[name]; ok {
			delete(byBroker, name)
			removed = true
		}
	}
	if len(byBroker) == 0 {
		delete(rt.mu.topics, topic)
	}
	return removed
}

// setWritePerm clears (wipe) or restores (add: read+write) the write
// permission of every queue data of brokerName and returns how many topics
// it changed (Java operateWritePermOfBroker).
func (rt *routeTable) setWritePerm(brokerName string, wipe bool) int32 {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	var n int32
	for _, byBroker := range rt.mu.topics {
		qd, ok := byBroker[brokerName]
		if !ok {
			continue
		}
		if wipe {
			qd.Perm &^= protocol.PermWrite
		} else {
			qd.Perm = protocol.PermRead | protocol.PermWrite
		}
		byBroker[brokerName] = qd
		n++
	}
	return n
}

// registerTopic sets the queue data of topic for each broker in qds; every
// broker must be registered, else nothing changes and the first unknown
// broker name is returned (Java registerTopic).
func (rt *routeTable) registerTopic(topic string, qds []protocol.QueueData) (unknown string, ok bool) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for _, qd := range qds {
		if _, ok := rt.mu.brokers[qd.BrokerName]; !ok {
			return qd.BrokerName, false
		}
	}
	byBroker := rt.mu.topics[topic]
	if byBroker == nil {
		byBroker = make(map[string]protocol.QueueData, len(qds))
		rt.mu.topics[topic] = byBroker
	}
	for _, qd := range qds {
		byBroker[qd.BrokerName] = qd
	}
	return "", true
}

// queryDataVersion compares dv with the registered data version of
// (cluster, addr), refreshes that registration's timestamp, and returns the
// stored version (Java QUERY_DATA_VERSION). dv nil counts as changed.
func (rt *routeTable) queryDataVersion(cluster, addr string, dv *protocol.DataVersion, now time.Time) (changed bool, stored *protocol.DataVersion) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	li := rt.mu.live[brokerKey{cluster, addr}]
	if li == nil {
		return true, nil
	}
	li.lastUpdate = now
	v := li.dataVersion
	return dv == nil || *dv != v, &v
}
