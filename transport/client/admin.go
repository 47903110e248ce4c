package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// TopicConfig is a topic's configuration for CreateTopic: name, queue
// counts, permission bits (protocol.PermRead|PermWrite = 6), filter type,
// order flag, attributes.
type TopicConfig = protocol.TopicConfig

// Defaults CreateTopic fills in for zero fields.
const (
	DefaultAdminQueueNums = 8
	DefaultAdminPerm      = protocol.PermRead | protocol.PermWrite
)

// CreateTopic creates or updates a topic (UPDATE_AND_CREATE_TOPIC). target
// is a broker address ("host:port") or a cluster name, in which case every
// master of the cluster gets it. Zero queue counts become 8, a zero Perm
// RW, an empty filter type SINGLE_TAG. The brokers then register the topic
// with their name servers; Route finds it once they have (poll, or call
// RefreshRoute).
func (c *Client) CreateTopic(ctx context.Context, target string, tc TopicConfig) error {
	if err := validateName("topic", tc.TopicName, MaxTopicLength); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	if tc.ReadQueueNums == 0 {
		tc.ReadQueueNums = DefaultAdminQueueNums
	}
	if tc.WriteQueueNums == 0 {
		tc.WriteQueueNums = DefaultAdminQueueNums
	}
	if tc.Perm == 0 {
		tc.Perm = DefaultAdminPerm
	}
	if tc.TopicFilterType == "" {
		tc.TopicFilterType = protocol.TopicFilterSingleTag
	}
	if !protocol.PermValid(tc.Perm) || tc.ReadQueueNums < 0 || tc.WriteQueueNums < 0 {
		return fmt.Errorf("%w: topic config perm %d, queues %d/%d", ErrInvalidOption, tc.Perm, tc.ReadQueueNums, tc.WriteQueueNums)
	}
	addrs, err := c.targetMasters(ctx, target)
	if err != nil {
		return err
	}
	var errs []error
	for _, a := range addrs {
		req := protocol.NewRequest(protocol.ReqUpdateAndCreateTopic)
		h := protocol.CreateTopicRequestHeader{
			Topic: tc.TopicName, DefaultTopic: DefaultTopic,
			ReadQueueNums: tc.ReadQueueNums, WriteQueueNums: tc.WriteQueueNums,
			Perm: tc.Perm, TopicFilterType: tc.TopicFilterType, Order: tc.Order,
			TopicSysFlag: protocol.Some(tc.TopicSysFlag),
		}
		if len(tc.Attributes) > 0 {
			h.Attributes = encodeAttributes(tc.Attributes)
		}
		h.Encode(req)
		if err := c.adminCall(ctx, a, req); err != nil {
			errs = append(errs, fmt.Errorf("client: create topic %q on %s: %w", tc.TopicName, a, err))
		}
	}
	return errors.Join(errs...)
}

// encodeAttributes writes attributes as RocketMQ's "+k=v,+k2=v2".
func encodeAttributes(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b []byte
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '+')
		b = append(b, k...)
		b = append(b, '=')
		b = append(b, m[k]...)
	}
	return string(b)
}

// DeleteTopic deletes topic from every master of its route (or, when
// cluster is not empty, of that cluster) with DELETE_TOPIC_IN_BROKER, then
// from every name server with DELETE_TOPIC_IN_NAMESRV, and drops it from
// the route cache.
func (c *Client) DeleteTopic(ctx context.Context, topic, cluster string) error {
	var addrs []string
	var err error
	if cluster != "" {
		addrs, err = c.targetMasters(ctx, cluster)
	} else {
		var r *TopicRoute
		if r, err = c.RefreshRoute(ctx, topic); err == nil {
			for _, a := range r.masters {
				addrs = append(addrs, a)
			}
			slices.Sort(addrs)
		}
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, a := range addrs {
		req := protocol.NewRequest(protocol.ReqDeleteTopicInBroker)
		h := protocol.DeleteTopicRequestHeader{Topic: topic}
		h.Encode(req)
		if err := c.adminCall(ctx, a, req); err != nil {
			errs = append(errs, fmt.Errorf("client: delete topic %q on %s: %w", topic, a, err))
		}
	}
	nss, _ := c.nameServers()
	for _, ns := range nss {
		req := protocol.NewRequest(protocol.ReqDeleteTopicInNamesrv)
		h := protocol.DeleteTopicFromNamesrvRequestHeader{Topic: topic, ClusterName: cluster}
		h.Encode(req)
		if err := c.adminCall(ctx, ns, req); err != nil {
			errs = append(errs, fmt.Errorf("client: delete topic %q on name server %s: %w", topic, ns, err))
		}
	}
	c.routes.Lock()
	delete(c.routes.m, topic)
	delete(c.routes.def, topic)
	c.routes.Unlock()
	return errors.Join(errs...)
}

// ListTopics returns every topic a name server knows
// (GET_ALL_TOPIC_LIST_FROM_NAMESERVER), sorted.
func (c *Client) ListTopics(ctx context.Context) ([]string, error) {
	resp, err := c.nsInvoke(ctx, protocol.NewRequest(protocol.ReqGetAllTopicListFromNameServer))
	if err == nil {
		err = protocol.ResponseError(resp)
	}
	if err != nil {
		return nil, fmt.Errorf("client: list topics: %w", err)
	}
	var tl protocol.TopicList
	if err := tl.Decode(resp.Body); err != nil {
		return nil, fmt.Errorf("client: list topics: %w", err)
	}
	slices.Sort(tl.TopicList)
	return tl.TopicList, nil
}

// ClusterInfo returns the brokers and clusters a name server knows
// (GET_BROKER_CLUSTER_INFO).
func (c *Client) ClusterInfo(ctx context.Context) (*protocol.ClusterInfo, error) {
	resp, err := c.nsInvoke(ctx, protocol.NewRequest(protocol.ReqGetBrokerClusterInfo))
	if err == nil {
		err = protocol.ResponseError(resp)
	}
	if err != nil {
		return nil, fmt.Errorf("client: cluster info: %w", err)
	}
	ci := &protocol.ClusterInfo{}
	if err := ci.Decode(resp.Body); err != nil {
		return nil, fmt.Errorf("client: cluster info: %w", err)
	}
	return ci, nil
}

// ConsumerOffsets returns, for every queue of topic, the broker's max
// offset and group's committed offset (GET_CONSUME_STATS on each master
// of the topic's route; brokers that do not implement it are asked queue
// by queue with GET_MAX_OFFSET and QUERY_CONSUMER_OFFSET, a missing offset
// reported as -1).
func (c *Client) ConsumerOffsets(ctx context.Context, group, topic string) (map[protocol.MessageQueue]protocol.OffsetWrapper, error) {
	r, err := c.Route(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := map[protocol.MessageQueue]protocol.OffsetWrapper{}
	for _, name := range r.brokers {
		addr, ok := r.masters[name]
		if !ok {
			continue
		}
		req := protocol.NewRequest(protocol.ReqGetConsumeStats)
		h := protocol.GetConsumeStatsRequestHeader{ConsumerGroup: group, Topic: topic}
		h.Encode(req)
		resp, err := c.invoke(ctx, addr, req)
		if err != nil {
			return nil, fmt.Errorf("client: consume stats of %q on %s: %w", group, addr, err)
		}
		if resp.Code == protocol.ResRequestCodeNotSupported {
			if err := c.offsetsByQueue(ctx, group, r, name, out); err != nil {
				return nil, err
			}
			continue
		}
		if err := protocol.ResponseError(resp); err != nil {
			return nil, fmt.Errorf("client: consume stats of %q on %s: %w", group, addr, err)
		}
		var cs protocol.ConsumeStats
		if err := cs.Decode(resp.Body); err != nil {
			return nil, fmt.Errorf("client: consume stats of %q on %s: %w", group, addr, err)
		}
		for q, w := range cs.OffsetTable {
			if q.Topic == topic {
				out[q] = w
			}
		}
	}
	return out, nil
}

func (c *Client) offsetsByQueue(ctx context.Context, group string, r *TopicRoute, broker string, out map[protocol.MessageQueue]protocol.OffsetWrapper) error {
	for _, q := range r.subscribe {
		if q.BrokerName != broker {
			continue
		}
		maxOff, err := c.MaxOffset(ctx, q)
		if err != nil {
			return err
		}
		co, err := c.QueryConsumerOffset(ctx, group, q)
		if err != nil && !errors.Is(err, ErrNoOffset) {
			return err
		}
		out[q] = protocol.OffsetWrapper{BrokerOffset: maxOff, ConsumerOffset: co}
	}
	return nil
}

// targetMasters resolves a broker address or a cluster name to master
// addresses.
func (c *Client) targetMasters(ctx context.Context, target string) ([]string, error) {
	if _, _, err := net.SplitHostPort(target); err == nil {
		return []string{target}, nil
	}
	ci, err := c.ClusterInfo(ctx)
	if err != nil {
		return nil, err
	}
	names, ok := ci.ClusterAddrTable[target]
	if !ok {
		return nil, fmt.Errorf("%w: cluster %q unknown to the name servers", ErrNoRoute, target)
	}
	var addrs []string
	for _, n := range names {
		if a := ci.BrokerAddrTable[n].MasterAddr(); a != "" {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("%w: cluster %q has no master", ErrNoRoute, target)
	}
	slices.Sort(addrs)
	return addrs, nil
}

// adminCall sends req to addr and turns a non-success reply into an error.
func (c *Client) adminCall(ctx context.Context, addr string, req *protocol.Command) error {
	resp, err := c.invoke(ctx, addr, req)
	if err != nil {
		return err
	}
	return protocol.ResponseError(resp)
}

// BrokerHAStatus returns a broker's replication status
// (GET_BROKER_HA_STATUS, what `mqadmin haStatus` shows): a master's log end
// and connected slaves, or a slave's view of its master. Apache RocketMQ 5
// brokers and runnel's answer it; 4.x brokers answer
// REQUEST_CODE_NOT_SUPPORTED (protocol.ErrRequestCodeNotSupported).
func (c *Client) BrokerHAStatus(ctx context.Context, addr string) (*protocol.HARuntimeInfo, error) {
	resp, err := c.invoke(ctx, addr, protocol.NewRequest(protocol.ReqGetBrokerHAStatus))
	if err == nil {
		err = protocol.ResponseError(resp)
	}
	if err != nil {
		return nil, fmt.Errorf("client: HA status of %s: %w", addr, err)
	}
	info := &protocol.HARuntimeInfo{}
	if err := info.Decode(resp.Body); err != nil {
		return nil, fmt.Errorf("client: HA status of %s: %w", addr, err)
	}
	return info, nil
}
