package broker

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// The client registry (protocol §7.7): which connections heartbeat for
// which producer and consumer groups, with their subscriptions. It is one
// lock-protected struct; every request code it serves holds the lock only
// for map updates and never while writing to a connection.

// Limits on one heartbeat body, so a client cannot make the broker create
// an unbounded number of groups, retry topics or subscriptions at once.
const (
	maxHeartbeatGroups = 1024 // producer groups + consumer groups
	maxGroupSubs       = 1024 // subscriptions of one consumer group
)

// notifyQueueLen bounds the NOTIFY_CONSUMER_IDS_CHANGED sends waiting for
// the notifier goroutine; beyond it notifications are dropped (and
// counted): a client also rebalances every 20 s on its own.
const notifyQueueLen = 4096

// notifyTimeout bounds the queueing of one oneway notification.
const notifyTimeout = 3 * time.Second

// clientChannel is one client connection registered for a group.
type clientChannel struct {
	conn     *remoting.ServerConn
	clientID string
	language protocol.LanguageCode
	version  int32
	lastSeen time.Time
}

// consumerGroupInfo is one consumer group: its live channels and the
// subscriptions its clients declared (per topic, newest subVersion wins).
type consumerGroupInfo struct {
	consumeType      string
	messageModel     string
	consumeFromWhere string
	channels         map[*remoting.ServerConn]*clientChannel
	subs             map[string]Subscription
	subData          map[string]protocol.SubscriptionData // as received, for admin bodies
}

// producerGroupInfo is one producer group's live channels.
type producerGroupInfo struct {
	channels map[*remoting.ServerConn]*clientChannel
}

// notifyTask is one NOTIFY_CONSUMER_IDS_CHANGED to send.
type notifyTask struct {
	conn  *remoting.ServerConn
	group string
}

// clientRegistry tracks client channels per group. Safe for concurrent use.
type clientRegistry struct {
	b      *Broker
	log    *slog.Logger
	expiry time.Duration
	scan   time.Duration

	tick time.Duration

	notifyCh      chan notifyTask
	notifyDropped atomic.Int64

	mu struct {
		sync.Mutex
		consumers map[string]*consumerGroupInfo
		producers map[string]*producerGroupInfo
		// prodByClient indexes producer channels by clientID (reply push),
		// with the number of groups each connection is registered for.
		prodByClient map[string]map[*remoting.ServerConn]int
		// byConn indexes the groups each connection is registered in, so
		// that a connection's close costs its own registrations, not a
		// scan of every group's channels (a thousand connections closed
		// at once, by their idle timeout, made that quadratic).
		byConn map[*remoting.ServerConn]map[connReg]struct{}
	}
}

// connReg is one group a connection is registered in.
type connReg struct {
	group    string
	consumer bool
}

func newClientRegistry(b *Broker, cfg *subsystemConfig) *clientRegistry {
	r := &clientRegistry{
		b:        b,
		log:      b.logger(),
		expiry:   cfg.channelExpiry,
		scan:     cfg.channelScan,
		tick:     cfg.housekeepTick,
		notifyCh: make(chan notifyTask, notifyQueueLen),
	}
	r.mu.consumers = make(map[string]*consumerGroupInfo)
	r.mu.producers = make(map[string]*producerGroupInfo)
	r.mu.prodByClient = make(map[string]map[*remoting.ServerConn]int)
	r.mu.byConn = make(map[*remoting.ServerConn]map[connReg]struct{})
	return r
}

func (r *clientRegistry) register(s *remoting.Server) {
	s.Handle(protocol.ReqHeartbeat, remoting.ProcessorFunc(r.processHeartbeat))
	s.Handle(protocol.ReqUnregisterClient, remoting.ProcessorFunc(r.processUnregister))
	s.Handle(protocol.ReqGetConsumerListByGroup, remoting.ProcessorFunc(r.processConsumerList))
	s.Handle(protocol.ReqGetConsumerConnectionList, remoting.ProcessorFunc(r.processConsumerConnections))
	s.Handle(protocol.ReqGetProducerConnectionList, remoting.ProcessorFunc(r.processProducerConnections))
	s.Handle(protocol.ReqCheckClientConfig, remoting.ProcessorFunc(r.processCheckClientConfig))
}

// processCheckClientConfig serves CHECK_CLIENT_CONFIG (46), which a Java
// consumer sends at start for each subscription that is not a TAG
// expression (MQClientInstance.checkClientInBroker); the answer
// (filter.go, checkClientConfig) fails the consumer's start where a Java
// broker would fail it: SQL92 without WithPropertyFilter, or an expression
// that does not parse.
func (r *clientRegistry) processCheckClientConfig(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var body protocol.CheckClientRequestBody
	if err := body.Decode(req.Body); err != nil {
		return nil, &protocol.Error{Code: protocol.ResSystemError, Remark: err.Error()}
	}
	return r.b.checkClientConfig(req, body.SubscriptionData), nil
}

// ---- HEART_BEAT ----

func (r *clientRegistry) processHeartbeat(ctx context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var hb protocol.HeartbeatData
	if err := hb.Decode(req.Body); err != nil {
		return nil, fmt.Errorf("broker: heartbeat: %w", err)
	}
	if hb.ClientID == "" {
		return nil, &protocol.Error{Code: protocol.ResSystemError, Remark: "heartbeat without clientID"}
	}
	if n := len(hb.ConsumerDataSet) + len(hb.ProducerDataSet); n > maxHeartbeatGroups {
		return nil, &protocol.Error{Code: protocol.ResSystemError,
			Remark: fmt.Sprintf("heartbeat names %d groups, more than %d", n, maxHeartbeatGroups)}
	}
	var errs []error
	conn := rc.Conn()
	for i := range hb.ConsumerDataSet {
		cd := &hb.ConsumerDataSet[i]
		if cd.GroupName == "" {
			continue
		}
		if len(cd.SubscriptionDataSet) > maxGroupSubs {
			errs = append(errs, fmt.Errorf("consumer group %q declares %d subscriptions, more than %d",
				cd.GroupName, len(cd.SubscriptionDataSet), maxGroupSubs))
			continue
		}
		notify := true
		if gc, ok := r.b.groupConfig(cd.GroupName, true); ok {
			notify = gc.NotifyConsumerIdsChangedEnable
			if gc.RetryQueueNums > 0 {
				if _, err := r.b.ensureTopicRegistered(ctx, retryTopic(cd.GroupName), gc.RetryQueueNums, protocol.PermRead|protocol.PermWrite); err != nil {
					errs = append(errs, fmt.Errorf("consumer group %q: retry topic: %w", cd.GroupName, err))
				}
			}
		}
		targets := r.registerConsumer(conn, hb.ClientID, req.Language, req.Version, cd, hb.WithoutSub)
		if notify {
			r.notify(cd.GroupName, targets)
		}
	}
	for _, pd := range hb.ProducerDataSet {
		if pd.GroupName == "" {
			continue
		}
		r.registerProducer(conn, hb.ClientID, req.Language, req.Version, pd.GroupName)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("broker: heartbeat from %s: %w", hb.ClientID, err)
	}
	resp := protocol.NewResponse(req, protocol.ResSuccess, "")
	resp.SetExt("IS_SUPPORT_HEART_BEAT_V2", "true")
	resp.SetExt("IS_SUB_CHANGE", "true")
	return resp, nil
}

// toSubscription converts a heartbeat subscription to the pull path's form.
func toSubscription(sd *protocol.SubscriptionData) Subscription {
	s := Subscription{
		Topic:          sd.Topic,
		Expression:     sd.SubString,
		ExpressionType: sd.ExpressionType,
		Tags:           slices.Clone(sd.TagsSet),
		SubVersion:     sd.SubVersion,
		ClassFilter:    sd.ClassFilterMode,
	}
	if s.ExpressionType == "" {
		s.ExpressionType = protocol.ExpressionTypeTag
	}
	if len(sd.CodeSet) > 0 {
		s.TagCodes = make([]int64, len(sd.CodeSet))
		for i, c := range sd.CodeSet {
			s.TagCodes[i] = int64(c)
		}
	}
	return s
}

// registerConsumer adds or refreshes conn in group cd.GroupName and, unless
// withoutSub (a Java "heartbeat v2" that omits unchanged subscriptions),
// replaces the group's subscriptions. When the group's set of channels
// changed and the group is clustering, it returns the channels to notify
// (all of the group's channels).
func (r *clientRegistry) registerConsumer(conn *remoting.ServerConn, clientID string, lang protocol.LanguageCode, version int32, cd *protocol.ConsumerData, withoutSub bool) []*remoting.ServerConn {
	now := r.b.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.mu.consumers[cd.GroupName]
	if g == nil {
		g = &consumerGroupInfo{
			channels: make(map[*remoting.ServerConn]*clientChannel),
			subs:     make(map[string]Subscription),
			subData:  make(map[string]protocol.SubscriptionData),
		}
		r.mu.consumers[cd.GroupName] = g
	}
	g.consumeType, g.messageModel, g.consumeFromWhere = cd.ConsumeType, cd.MessageModel, cd.ConsumeFromWhere
	changed := false
	ch := g.channels[conn]
	if ch == nil || ch.clientID != clientID {
		changed = true
		ch = &clientChannel{conn: conn, clientID: clientID}
		g.channels[conn] = ch
		r.indexConnLocked(conn, connReg{cd.GroupName, true})
	}
	ch.language, ch.version, ch.lastSeen = lang, version, now

	if !withoutSub {
		r.updateSubscriptionsLocked(g, cd.SubscriptionDataSet)
	}
	if !changed || g.messageModel == protocol.MessageModelBroadcasting {
		return nil
	}
	return channelConns(g.channels)
}

// updateSubscriptionsLocked adds new topics, replaces those declared with a
// newer subVersion and drops topics no longer declared (Java
// ConsumerGroupInfo.updateSubscription).
func (r *clientRegistry) updateSubscriptionsLocked(g *consumerGroupInfo, subs []protocol.SubscriptionData) {
	seen := make(map[string]struct{}, len(subs))
	for i := range subs {
		sd := &subs[i]
		if sd.Topic == "" {
			continue
		}
		seen[sd.Topic] = struct{}{}
		if old, ok := g.subs[sd.Topic]; ok && sd.SubVersion <= old.SubVersion {
			continue
		}
		g.subs[sd.Topic] = toSubscription(sd)
		g.subData[sd.Topic] = *sd
	}
	for t := range g.subs {
		if _, ok := seen[t]; !ok {
			delete(g.subs, t)
			delete(g.subData, t)
		}
	}
}

func (r *clientRegistry) registerProducer(conn *remoting.ServerConn, clientID string, lang protocol.LanguageCode, version int32, group string) {
	now := r.b.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.mu.producers[group]
	if g == nil {
		g = &producerGroupInfo{channels: make(map[*remoting.ServerConn]*clientChannel)}
		r.mu.producers[group] = g
	}
	ch := g.channels[conn]
	if ch != nil && ch.clientID != clientID {
		r.unindexProducerLocked(ch)
		ch = nil
	}
	if ch == nil {
		ch = &clientChannel{conn: conn, clientID: clientID}
		g.channels[conn] = ch
		r.indexConnLocked(conn, connReg{group, false})
		m := r.mu.prodByClient[clientID]
		if m == nil {
			m = make(map[*remoting.ServerConn]int)
			r.mu.prodByClient[clientID] = m
		}
		m[conn]++
	}
	ch.language, ch.version, ch.lastSeen = lang, version, now
}

func (r *clientRegistry) unindexProducerLocked(ch *clientChannel) {
	m := r.mu.prodByClient[ch.clientID]
	if m == nil {
		return
	}
	if m[ch.conn]--; m[ch.conn] <= 0 {
		delete(m, ch.conn)
	}
	if len(m) == 0 {
		delete(r.mu.prodByClient, ch.clientID)
	}
}

// indexConnLocked records that conn is registered in reg.
func (r *clientRegistry) indexConnLocked(conn *remoting.ServerConn, reg connReg) {
	m := r.mu.byConn[conn]
	if m == nil {
		m = make(map[connReg]struct{}, 1)
		r.mu.byConn[conn] = m
	}
	m[reg] = struct{}{}
}

// unindexConnLocked forgets that conn is registered in reg.
func (r *clientRegistry) unindexConnLocked(conn *remoting.ServerConn, reg connReg) {
	m := r.mu.byConn[conn]
	delete(m, reg)
	if len(m) == 0 {
		delete(r.mu.byConn, conn)
	}
}

func channelConns(m map[*remoting.ServerConn]*clientChannel) []*remoting.ServerConn {
	out := make([]*remoting.ServerConn, 0, len(m))
	for c := range m {
		out = append(out, c)
	}
	return out
}

// ---- removal: unregister, disconnect, expiry ----

// removeMatching removes every registration for which match returns true,
// deletes groups left empty, and queues notifications to the remaining
// channels of each clustering consumer group that lost a channel.
func (r *clientRegistry) removeMatching(match func(group string, consumer bool, ch *clientChannel) bool) {
	var notes []pendingNote
	r.mu.Lock()
	for name, g := range r.mu.consumers {
		removed := false
		for c, ch := range g.channels {
			if match(name, true, ch) {
				delete(g.channels, c)
				r.unindexConnLocked(c, connReg{name, true})
				removed = true
			}
		}
		if removed {
			notes = r.consumerLeftLocked(name, g, notes)
		}
	}
	for name, g := range r.mu.producers {
		for c, ch := range g.channels {
			if match(name, false, ch) {
				r.unindexConnLocked(c, connReg{name, false})
				r.producerLeftLocked(name, g, c, ch)
			}
		}
	}
	r.mu.Unlock()
	r.notifyRemoved(notes)
}

// consumerLeftLocked follows the removal of channels of consumer group g:
// an empty group is deleted, else (clustering mode) its remaining
// channels are added to notes for a NOTIFY_CONSUMER_IDS_CHANGED.
func (r *clientRegistry) consumerLeftLocked(name string, g *consumerGroupInfo, notes []pendingNote) []pendingNote {
	if len(g.channels) == 0 {
		delete(r.mu.consumers, name)
		return notes
	}
	if g.messageModel != protocol.MessageModelBroadcasting {
		notes = append(notes, pendingNote{name, channelConns(g.channels)})
	}
	return notes
}

// producerLeftLocked removes the channel ch of conn from producer group g,
// deleting the group once empty.
func (r *clientRegistry) producerLeftLocked(name string, g *producerGroupInfo, conn *remoting.ServerConn, ch *clientChannel) {
	delete(g.channels, conn)
	r.unindexProducerLocked(ch)
	if len(g.channels) == 0 {
		delete(r.mu.producers, name)
	}
}

// pendingNote is a consumer group that lost a channel, with its remaining
// channels to notify.
type pendingNote struct {
	group   string
	targets []*remoting.ServerConn
}

// notifyRemoved queues the notifications of removeMatching and removeConn
// (outside the registry's lock).
func (r *clientRegistry) notifyRemoved(notes []pendingNote) {
	for _, n := range notes {
		if gc, ok := r.b.groupConfig(n.group, false); ok && !gc.NotifyConsumerIdsChangedEnable {
			continue
		}
		r.notify(n.group, n.targets)
	}
}

// removeConn drops every registration of a closed connection (the
// broker's OnDisconnect): those byConn lists, with removeMatching's
// effects (empty groups deleted, consumer groups notified).
func (r *clientRegistry) removeConn(conn *remoting.ServerConn) {
	var notes []pendingNote
	r.mu.Lock()
	regs := r.mu.byConn[conn]
	delete(r.mu.byConn, conn)
	for reg := range regs {
		if reg.consumer {
			g := r.mu.consumers[reg.group]
			if g == nil || g.channels[conn] == nil {
				continue
			}
			delete(g.channels, conn)
			notes = r.consumerLeftLocked(reg.group, g, notes)
			continue
		}
		if g := r.mu.producers[reg.group]; g != nil && g.channels[conn] != nil {
			r.producerLeftLocked(reg.group, g, conn, g.channels[conn])
		}
	}
	r.mu.Unlock()
	r.notifyRemoved(notes)
}

func (r *clientRegistry) processUnregister(ctx context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var h protocol.UnregisterClientRequestHeader
	if err := h.Decode(req); err != nil {
		return nil, &protocol.Error{Code: protocol.ResSystemError, Remark: err.Error()}
	}
	r.removeMatching(func(group string, consumer bool, ch *clientChannel) bool {
		if ch.clientID != h.ClientID {
			return false
		}
		if consumer {
			return group == h.ConsumerGroup
		}
		return group == h.ProducerGroup
	})
	return protocol.NewResponse(req, protocol.ResSuccess, ""), nil
}

// expire removes channels that have not heartbeated within the expiry, and
// those whose connection already closed, and closes the expired
// connections (as Java's housekeeping does).
func (r *clientRegistry) expire() {
	deadline := r.b.now().Add(-r.expiry)
	var stale []*remoting.ServerConn
	r.removeMatching(func(_ string, _ bool, ch *clientChannel) bool {
		select {
		case <-ch.conn.Done():
			return true
		default:
		}
		if ch.lastSeen.Before(deadline) {
			stale = append(stale, ch.conn)
			return true
		}
		return false
	})
	for _, c := range stale {
		r.log.Info("broker: closing client channel: no heartbeat", "remote", c.RemoteAddr().String(), "expiry", r.expiry)
		_ = c.Close() // always nil
	}
}

// ---- NOTIFY_CONSUMER_IDS_CHANGED ----

// notify queues a NOTIFY_CONSUMER_IDS_CHANGED for each target. It never
// blocks: when the queue is full the notification is dropped and counted.
func (r *clientRegistry) notify(group string, targets []*remoting.ServerConn) {
	for _, c := range targets {
		select {
		case r.notifyCh <- notifyTask{conn: c, group: group}:
		default:
			r.notifyDropped.Add(1)
			r.log.Warn("broker: consumer-change notification dropped: queue full", "group", group)
		}
	}
}

// runNotifier sends queued notifications until ctx ends.
func (r *clientRegistry) runNotifier(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case t := <-r.notifyCh:
			r.sendNotify(ctx, t)
		}
	}
}

func (r *clientRegistry) sendNotify(ctx context.Context, t notifyTask) {
	select {
	case <-t.conn.Done():
		return
	default:
	}
	cmd := protocol.NewRequest(protocol.ReqNotifyConsumerIDsChanged)
	h := protocol.NotifyConsumerIDsChangedRequestHeader{ConsumerGroup: t.group}
	h.Encode(cmd)
	ctx, cancel := context.WithTimeout(ctx, notifyTimeout)
	defer cancel()
	if err := t.conn.InvokeOneway(ctx, cmd); err != nil {
		r.log.Debug("broker: notify consumer ids changed failed", "group", t.group,
			"remote", t.conn.RemoteAddr().String(), "err", err)
	}
}

// ---- queries ----

// subscription returns the subscription group registered for topic.
func (r *clientRegistry) subscription(group, topic string) (Subscription, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.mu.consumers[group]
	if g == nil {
		return Subscription{}, false
	}
	s, ok := g.subs[topic]
	return s, ok
}

// consumerIDs returns the sorted, distinct clientIDs of group's channels.
func (r *clientRegistry) consumerIDs(group string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.mu.consumers[group]
	if g == nil {
		return nil
	}
	ids := make([]string, 0, len(g.channels))
	for _, ch := range g.channels {
		ids = append(ids, ch.clientID)
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// producerChannels returns the live channels of a producer group
// (transaction check-back), in no particular order.
func (r *clientRegistry) producerChannels(group string) []*remoting.ServerConn {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.mu.producers[group]
	if g == nil {
		return nil
	}
	return channelConns(g.channels)
}

// producerByClientID returns a live producer channel of the client, or nil.
func (r *clientRegistry) producerByClientID(clientID string) *remoting.ServerConn {
	r.mu.Lock()
	defer r.mu.Unlock()
	for c := range r.mu.prodByClient[clientID] {
		select {
		case <-c.Done():
			continue
		default:
			return c
		}
	}
	return nil
}

func (r *clientRegistry) processConsumerList(ctx context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var h protocol.GetConsumerListByGroupRequestHeader
	if err := h.Decode(req); err != nil {
		return nil, &protocol.Error{Code: protocol.ResSystemError, Remark: err.Error()}
	}
	ids := r.consumerIDs(h.ConsumerGroup)
	if len(ids) == 0 {
		return protocol.NewResponse(req, protocol.ResSystemError, "no consumer for this group, "+h.ConsumerGroup), nil
	}
	body := protocol.GetConsumerListByGroupResponseBody{ConsumerIDList: ids}
	b, err := body.Encode()
	if err != nil {
		return nil, err
	}
	resp := protocol.NewResponse(req, protocol.ResSuccess, "")
	resp.Body = b
	return resp, nil
}

// connectionJSON is one entry of a ConsumerConnection/ProducerConnection
// connectionSet (Java Connection).
type connectionJSON struct {
	ClientAddr string `json:"clientAddr"`
	ClientID   string `json:"clientId"`
	Language   string `json:"language"`
	Version    int32  `json:"version"`
}

func connections(m map[*remoting.ServerConn]*clientChannel) []connectionJSON {
	out := make([]connectionJSON, 0, len(m))
	for _, ch := range m {
		out = append(out, connectionJSON{
			ClientAddr: ch.conn.RemoteAddr().String(),
			ClientID:   ch.clientID,
			Language:   ch.language.String(),
			Version:    ch.version,
		})
	}
	slices.SortFunc(out, func(a, b connectionJSON) int {
		return cmp.Or(cmp.Compare(a.ClientID, b.ClientID), cmp.Compare(a.ClientAddr, b.ClientAddr))
	})
	return out
}

// processConsumerConnections answers GET_CONSUMER_CONNECTION_LIST (203)
// with a Java ConsumerConnection body; admin only, so encoding/json.
func (r *clientRegistry) processConsumerConnections(ctx context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var h protocol.GetConsumerConnectionListRequestHeader
	if err := h.Decode(req); err != nil {
		return nil, &protocol.Error{Code: protocol.ResSystemError, Remark: err.Error()}
	}
	var body struct {
		ConnectionSet     []connectionJSON                     `json:"connectionSet"`
		ConsumeFromWhere  string                               `json:"consumeFromWhere"`
		ConsumeType       string                               `json:"consumeType"`
		MessageModel      string                               `json:"messageModel"`
		SubscriptionTable map[string]protocol.SubscriptionData `json:"subscriptionTable"`
	}
	r.mu.Lock()
	g := r.mu.consumers[h.ConsumerGroup]
	if g != nil {
		body.ConnectionSet = connections(g.channels)
		body.ConsumeFromWhere, body.ConsumeType, body.MessageModel = g.consumeFromWhere, g.consumeType, g.messageModel
		body.SubscriptionTable = make(map[string]protocol.SubscriptionData, len(g.subData))
		for t, sd := range g.subData {
			sd.TagsSet, sd.CodeSet = nonNilSlice(sd.TagsSet), nonNilSlice(sd.CodeSet)
			body.SubscriptionTable[t] = sd
		}
	}
	r.mu.Unlock()
	if g == nil {
		return protocol.NewResponse(req, protocol.ResConsumerNotOnline, "the consumer group["+h.ConsumerGroup+"] not online"), nil
	}
	return jsonResponse(req, &body)
}

// processProducerConnections answers GET_PRODUCER_CONNECTION_LIST (204).
func (r *clientRegistry) processProducerConnections(ctx context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var h protocol.GetProducerConnectionListRequestHeader
	if err := h.Decode(req); err != nil {
		return nil, &protocol.Error{Code: protocol.ResSystemError, Remark: err.Error()}
	}
	var body struct {
		ConnectionSet []connectionJSON `json:"connectionSet"`
	}
	r.mu.Lock()
	g := r.mu.producers[h.ProducerGroup]
	if g != nil {
		body.ConnectionSet = connections(g.channels)
	}
	r.mu.Unlock()
	if g == nil {
		return protocol.NewResponse(req, protocol.ResSystemError, "the producer group["+h.ProducerGroup+"] not exist"), nil
	}
	return jsonResponse(req, &body)
}

func jsonResponse(req *protocol.Command, v any) (*protocol.Command, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("broker: encode response body: %w", err)
	}
	resp := protocol.NewResponse(req, protocol.ResSuccess, "")
	resp.Body = b
	return resp, nil
}

func nonNilSlice[S ~[]E, E any](s S) S {
	if s == nil {
		return S{}
	}
	return s
}
