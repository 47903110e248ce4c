package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// DefaultTopic is the template topic producers route new topics through
// (TBW102): the broker creates a topic from it on the first send.
const DefaultTopic = "TBW102"

// TopicRoute is a topic's route as a name server gave it, with the queue
// lists derived from it. A TopicRoute is immutable once returned: it is
// safe for concurrent use, and the slices it returns must not be modified.
type TopicRoute struct {
	// Topic is the topic the route is for.
	Topic string
	// Data is the decoded GET_ROUTEINFO_BY_TOPIC body.
	Data protocol.TopicRouteData

	publish   []protocol.MessageQueue
	subscribe []protocol.MessageQueue
	masters   map[string]string // broker name → master address
	brokers   []string          // sorted broker names
	fetched   time.Time
}

// newTopicRoute derives the queue lists of d as RocketMQ clients do:
// publish queues are the writable queues (writeQueueNums per broker) of
// brokers that have a master, or the orderTopicConf layout when set;
// subscribe queues are the readable queues (readQueueNums per broker).
// Both are sorted by broker name, then queue id. capQueues > 0 caps the
// queue count per broker (routes derived from TBW102).
func newTopicRoute(topic string, d protocol.TopicRouteData, capQueues int32) *TopicRoute {
	r := &TopicRoute{Topic: topic, Data: d, masters: map[string]string{}, fetched: time.Now()}
	for _, bd := range d.BrokerDatas {
		if a := bd.MasterAddr(); a != "" {
			r.masters[bd.BrokerName] = a
		}
		r.brokers = append(r.brokers, bd.BrokerName)
	}
	slices.Sort(r.brokers)
	r.brokers = slices.Compact(r.brokers)
	qds := slices.Clone(d.QueueDatas)
	slices.SortFunc(qds, func(a, b protocol.QueueData) int { return strings.Compare(a.BrokerName, b.BrokerName) })
	capped := func(n int32) int32 {
		if capQueues > 0 && n > capQueues {
			return capQueues
		}
		return max(n, 0)
	}
	if d.OrderTopicConf != "" {
		for _, item := range strings.Split(d.OrderTopicConf, ";") {
			name, num, ok := strings.Cut(item, ":")
			n, err := strconv.Atoi(num)
			if !ok || err != nil || n <= 0 || n > 1<<16 {
				continue
			}
			for q := range int32(n) {
				r.publish = append(r.publish, protocol.MessageQueue{Topic: topic, BrokerName: name, QueueID: q})
			}
		}
	} else {
		for _, qd := range qds {
			if !protocol.PermWritable(qd.Perm) || r.masters[qd.BrokerName] == "" {
				continue
			}
			for q := range capped(qd.WriteQueueNums) {
				r.publish = append(r.publish, protocol.MessageQueue{Topic: topic, BrokerName: qd.BrokerName, QueueID: q})
			}
		}
	}
	for _, qd := range qds {
		if !protocol.PermReadable(qd.Perm) {
			continue
		}
		for q := range capped(qd.ReadQueueNums) {
			r.subscribe = append(r.subscribe, protocol.MessageQueue{Topic: topic, BrokerName: qd.BrokerName, QueueID: q})
		}
	}
	return r
}

// SubscribeQueues returns the readable queues, sorted by broker name then
// queue id. The slice is shared: do not modify it.
func (r *TopicRoute) SubscribeQueues() []protocol.MessageQueue { return r.subscribe }

// PublishQueues returns the writable queues of brokers with a master, sorted
// by broker name then queue id. The slice is shared: do not modify it.
func (r *TopicRoute) PublishQueues() []protocol.MessageQueue { return r.publish }

// MasterAddr returns the address of the master (broker id 0) of brokerName.
func (r *TopicRoute) MasterAddr(brokerName string) (string, bool) {
	a, ok := r.masters[brokerName]
	return a, ok
}

// BrokerAddr returns the address of broker id of brokerName.
func (r *TopicRoute) BrokerAddr(brokerName string, id int64) (string, bool) {
	for _, bd := range r.Data.BrokerDatas {
		if bd.BrokerName == brokerName {
			a, ok := bd.BrokerAddrs[id]
			return a, ok && a != ""
		}
	}
	return "", false
}

// SlaveAddr returns the address of the slave with the lowest broker id of
// brokerName, and that id.
func (r *TopicRoute) SlaveAddr(brokerName string) (string, int64, bool) {
	for _, bd := range r.Data.BrokerDatas {
		if bd.BrokerName != brokerName {
			continue
		}
		best, addr := int64(-1), ""
		for id, a := range bd.BrokerAddrs {
			if id != protocol.MasterID && a != "" && (best < 0 || id < best) {
				best, addr = id, a
			}
		}
		return addr, best, best > 0
	}
	return "", 0, false
}

// BrokerNames returns the names of the route's brokers, sorted. The slice
// is shared: do not modify it.
func (r *TopicRoute) BrokerNames() []string { return r.brokers }

// Route returns topic's route: from the cache, or else from a name server
// (then cached and refreshed every route-refresh interval). When no name
// server knows the topic the error wraps protocol.ErrTopicNotExist. It
// blocks for at most one name-server round trip (with failover), bounded by
// ctx.
func (c *Client) Route(ctx context.Context, topic string) (*TopicRoute, error) {
	c.routes.RLock()
	r := c.routes.m[topic]
	c.routes.RUnlock()
	if r != nil {
		return r, nil
	}
	if c.closed.Load() {
		return nil, ErrClosed
	}
	r, err := c.fetchRoute(ctx, topic)
	if err != nil {
		return nil, err
	}
	c.storeRoute(r)
	return r, nil
}

// RefreshRoute fetches topic's route from a name server now, replacing the
// cached one.
func (c *Client) RefreshRoute(ctx context.Context, topic string) (*TopicRoute, error) {
	r, err := c.fetchRoute(ctx, topic)
	if err != nil {
		if errors.Is(err, protocol.ErrTopicNotExist) {
			c.routes.Lock()
			delete(c.routes.m, topic)
			c.routes.Unlock()
		}
		return nil, err
	}
	c.storeRoute(r)
	return r, nil
}

func (c *Client) storeRoute(r *TopicRoute) {
	c.routes.Lock()
	c.routes.m[r.Topic] = r
	delete(c.routes.def, r.Topic)
	c.routes.Unlock()
}

// fetchRoute asks a name server for topic's route.
func (c *Client) fetchRoute(ctx context.Context, topic string) (*TopicRoute, error) {
	req := protocol.NewRequest(protocol.ReqGetRouteInfoByTopic)
	h := protocol.GetRouteInfoRequestHeader{Topic: topic, AcceptStandardJSONOnly: protocol.Some(true)}
	h.Encode(req)
	resp, err := c.nsInvoke(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("client: route of %q: %w", topic, err)
	}
	if err := protocol.ResponseError(resp); err != nil {
		return nil, fmt.Errorf("client: route of %q: %w", topic, err)
	}
	var d protocol.TopicRouteData
	if err := d.Decode(resp.Body); err != nil {
		return nil, fmt.Errorf("client: route of %q: %w", topic, err)
	}
	return newTopicRoute(topic, d, 0), nil
}

// publishRoute returns the route a producer sends topic's messages by: the
// topic's own route, or, when the name servers do not know the topic yet,
// TBW102's route with at most defQueues queues per broker (the broker
// creates the topic on the first send). The derived route is replaced by
// the real one on a later refresh.
func (c *Client) publishRoute(ctx context.Context, topic string, defQueues int32) (*TopicRoute, error) {
	c.routes.RLock()
	r := c.routes.m[topic]
	if r == nil {
		r = c.routes.def[topic]
	}
	c.routes.RUnlock()
	if r != nil {
		return r, nil
	}
	r, err := c.Route(ctx, topic)
	if err == nil || !errors.Is(err, protocol.ErrTopicNotExist) {
		return r, err
	}
	dr, derr := c.fetchRoute(ctx, DefaultTopic)
	if derr != nil {
		return nil, fmt.Errorf("%w: %w (and default topic: %w)", ErrNoRoute, err, derr)
	}
	r = newTopicRoute(topic, dr.Data, defQueues)
	c.routes.Lock()
	if cur := c.routes.m[topic]; cur != nil {
		r = cur
	} else {
		c.routes.def[topic] = r
	}
	c.routes.Unlock()
	return r, nil
}

// routeLoop refreshes every cached route each interval. A transport error
// keeps the old route; TOPIC_NOT_EXIST removes a real route (deleted topic)
// but keeps a TBW102-derived one. Connections to brokers no route names any
// more are closed.
func (c *Client) routeLoop(ctx context.Context) {
	t := time.NewTicker(c.cfg.routeRefresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.refreshAll(ctx)
		}
	}
}

func (c *Client) refreshAll(ctx context.Context) {
	c.routes.RLock()
	topics := make([]string, 0, len(c.routes.m)+len(c.routes.def))
	for t := range c.routes.m {
		topics = append(topics, t)
	}
	for t := range c.routes.def {
		topics = append(topics, t)
	}
	c.routes.RUnlock()
	before := c.brokerAddrsInRoutes()
	for _, t := range topics {
		if ctx.Err() != nil {
			return
		}
		r, err := c.fetchRoute(ctx, t)
		switch {
		case err == nil:
			c.storeRoute(r)
		case errors.Is(err, protocol.ErrTopicNotExist):
			c.routes.Lock()
			delete(c.routes.m, t)
			c.routes.Unlock()
		default:
			if ctx.Err() == nil {
				c.log.Debug("client: route refresh", "topic", t, "err", err)
			}
		}
	}
	after := c.brokerAddrsInRoutes()
	for a := range before {
		if !after[a] && !c.isNameServer(a) {
			c.dropConn(a)
		}
	}
}

func (c *Client) brokerAddrsInRoutes() map[string]bool {
	out := map[string]bool{}
	c.routes.RLock()
	defer c.routes.RUnlock()
	for _, m := range []map[string]*TopicRoute{c.routes.m, c.routes.def} {
		for _, r := range m {
			for _, bd := range r.Data.BrokerDatas {
				for _, a := range bd.BrokerAddrs {
					out[a] = true
				}
			}
		}
	}
	return out
}

func (c *Client) isNameServer(addr string) bool {
	addrs, _ := c.nameServers()
	return slices.Contains(addrs, addr)
}

// masterOf returns the master address of q's broker, for requests that
// only a master serves (pop, send-back: they write).
func (c *Client) masterOf(ctx context.Context, q protocol.MessageQueue) (string, error) {
	r, err := c.Route(ctx, q.Topic)
	if err != nil {
		return "", err
	}
	addr, ok := r.MasterAddr(q.BrokerName)
	if !ok {
		return "", fmt.Errorf("%w: broker %q of %s has no master", ErrNoRoute, q.BrokerName, q)
	}
	return addr, nil
}
