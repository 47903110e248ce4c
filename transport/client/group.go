package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// Errors of GroupConsumer.
var (
	// ErrGroupStarted is returned by Subscribe and Start after Start.
	ErrGroupStarted = errors.New("client: group consumer already started")
	// ErrGroupClosed is returned by Subscribe and Start after Close, and by
	// Start when the Client is closed.
	ErrGroupClosed = errors.New("client: group consumer closed")
	// ErrNoSubscription is returned by Start when nothing was subscribed.
	ErrNoSubscription = errors.New("client: group consumer has no subscription")
)

// errNotMember means the broker's member list lacks this client (its
// heartbeat has not arrived, or it expired): keep the assignment.
var errNotMember = errors.New("client: this client is not in the group's member list")

// Default GroupConsumer settings (protocol reference §6.3, §7.8).
const (
	DefaultRebalanceInterval = 20 * time.Second
	DefaultLockRenewInterval = 20 * time.Second
	DefaultLockValidity      = 30 * time.Second
	DefaultGroupTimeout      = 3 * time.Second
)

// Bounds of GroupConsumer inputs.
const (
	maxGroupName  = 255
	maxMembers    = 1 << 16 // member ids accepted from one consumer list
	maxLockRetry  = 2 * time.Second
	firstLockWait = 100 * time.Millisecond
	// retryRouteWait is how long after Start a group whose retry topic has
	// no route yet rebalances as often as one waiting for a lock: the
	// broker creates that topic on the group's first heartbeat, and a Java
	// broker tells the name server a moment later, after Start's lookup.
	retryRouteWait = time.Minute
)

// RebalanceListener is told about changes of a GroupConsumer's assignment.
//
// Ordering guarantees, per GroupConsumer:
//   - Listener calls never overlap: OnRevoke, OnAssign and OnLockLost run
//     one at a time, on the consumer's rebalance goroutine (and, after it
//     ended, in Close for the last revocation).
//   - OnRevoke(queues) runs while the queues are still owned and, in locking
//     mode, still locked on the broker. Only after it returns are they
//     removed from Assignment and, in locking mode, unlocked — so the
//     caller can finish the work in flight (flush, checkpoint) first.
//   - OnAssign(queues) runs after the queues were added to Assignment and,
//     in locking mode, after the broker granted their locks.
//   - In one rebalance, OnRevoke precedes OnAssign; a queue is revoked at
//     most once per assignment.
//
// ctx is cancelled when the GroupConsumer or its Client closes (except in
// Close's final OnRevoke, whose ctx is bounded by the group timeout);
// listeners should return promptly: while one runs, no other rebalance or
// lock-loss report is processed (lock renewal goes on).
type RebalanceListener interface {
	OnAssign(ctx context.Context, queues []protocol.MessageQueue)
	OnRevoke(ctx context.Context, queues []protocol.MessageQueue)
}

// LockLossListener is an optional extension of RebalanceListener, required
// in locking mode: OnLockLost reports owned queues whose broker lock was
// refused on renewal (another member holds it) or whose validity lapsed
// without a successful renewal. The queues were already removed from
// Assignment when it is called; the caller must stop (fence) their
// processing at once. They are not revoked again; a later rebalance may
// assign them anew (OnAssign) once their lock is granted again.
type LockLossListener interface {
	OnLockLost(ctx context.Context, queues []protocol.MessageQueue)
}

// ListenerFuncs is a RebalanceListener and LockLossListener made of
// functions; nil fields are skipped.
type ListenerFuncs struct {
	Assign   func(ctx context.Context, queues []protocol.MessageQueue)
	Revoke   func(ctx context.Context, queues []protocol.MessageQueue)
	LockLost func(ctx context.Context, queues []protocol.MessageQueue)
}

// OnAssign calls f.Assign.
func (f ListenerFuncs) OnAssign(ctx context.Context, qs []protocol.MessageQueue) {
	if f.Assign != nil {
		f.Assign(ctx, qs)
	}
}

// OnRevoke calls f.Revoke.
func (f ListenerFuncs) OnRevoke(ctx context.Context, qs []protocol.MessageQueue) {
	if f.Revoke != nil {
		f.Revoke(ctx, qs)
	}
}

// OnLockLost calls f.LockLost.
func (f ListenerFuncs) OnLockLost(ctx context.Context, qs []protocol.MessageQueue) {
	if f.LockLost != nil {
		f.LockLost(ctx, qs)
	}
}

// GroupOption configures a GroupConsumer.
type GroupOption interface{ apply(*groupConfig) }

type groupOptionFunc func(*groupConfig)

func (f groupOptionFunc) apply(c *groupConfig) { f(c) }

type groupConfig struct {
	allocator         Allocator
	rebalanceInterval time.Duration
	broadcasting      bool
	locking           bool
	lockRenew         time.Duration
	lockValidity      time.Duration
	timeout           time.Duration
	listener          RebalanceListener
	lockLost          LockLossListener
	maxReconsume      int32 // SendBack's maxReconsumeTimes (DefaultMaxReconsumeTimes)
	// Set by PushConsumer (push.go): the heartbeat's consumeType and
	// consumeFromWhere ("" = CONSUME_ACTIVELY, CONSUME_FROM_LAST_OFFSET).
	consumeType string
	consumeFrom string
	push        pushConfig // PushConsumer-only options (push.go)
}

// WithAllocator sets the allocation strategy (default AllocateAveragely).
// Every member of a group must use the same strategy.
func WithAllocator(a Allocator) GroupOption {
	return groupOptionFunc(func(c *groupConfig) { c.allocator = a })
}

// WithRebalanceInterval sets the period of the rebalance timer (default
// 20 s). Membership notifications from brokers trigger rebalances sooner.
func WithRebalanceInterval(d time.Duration) GroupOption {
	return groupOptionFunc(func(c *groupConfig) { c.rebalanceInterval = d })
}

// WithBroadcasting makes the group consume in broadcasting mode: every
// member owns every queue and no member list is asked for. The default is
// clustering. Broadcasting excludes WithQueueLocking.
func WithBroadcasting() GroupOption {
	return groupOptionFunc(func(c *groupConfig) { c.broadcasting = true })
}

// WithQueueLocking turns on locking (orderly) mode: a queue is owned only
// while this client holds its broker lock (LOCK_BATCH_MQ), renewed
// periodically. The broker lock is the fence between members.
func WithQueueLocking(on bool) GroupOption {
	return groupOptionFunc(func(c *groupConfig) { c.locking = on })
}

// WithLockRenewInterval sets how often locks are renewed (default 20 s).
func WithLockRenewInterval(d time.Duration) GroupOption {
	return groupOptionFunc(func(c *groupConfig) { c.lockRenew = d })
}

// WithLockValidity sets how long this client trusts a lock after the
// request that granted it was sent (default 30 s). It must exceed the
// renew interval and stay well below the broker's lock expiry (60 s by
// default), so that this client gives a queue up before the broker can
// grant it to another.
func WithLockValidity(d time.Duration) GroupOption {
	return groupOptionFunc(func(c *groupConfig) { c.lockValidity = d })
}

// WithGroupTimeout bounds each request the GroupConsumer sends (consumer
// list, locks, unregistration; default 3 s).
func WithGroupTimeout(d time.Duration) GroupOption {
	return groupOptionFunc(func(c *groupConfig) { c.timeout = d })
}

// WithMaxReconsumeTimes sets how many times SendBack lets a message come
// back before the broker moves it to the group's dead-letter topic
// (%DLQ%<group>; DefaultMaxReconsumeTimes, RocketMQ's 16).
func WithMaxReconsumeTimes(n int) GroupOption {
	return groupOptionFunc(func(c *groupConfig) { c.maxReconsume = int32(n) })
}

// WithListener sets the rebalance listener. In locking mode it must also
// implement LockLossListener.
func WithListener(l RebalanceListener) GroupOption {
	return groupOptionFunc(func(c *groupConfig) { c.listener = l })
}

func validGroupName(g string) bool {
	if g == "" || len(g) > maxGroupName {
		return false
	}
	for i := 0; i < len(g); i++ {
		switch b := g[i]; {
		case b >= 'a' && b <= 'z', b >= 'A' && b <= 'Z', b >= '0' && b <= '9',
			b == '%', b == '|', b == '_', b == '-':
		default:
			return false
		}
	}
	return true
}

func (c *groupConfig) validate() error {
	switch {
	case c.allocator == nil:
		return errors.New("client: nil allocator")
	case c.rebalanceInterval <= 0:
		return fmt.Errorf("client: rebalance interval %v must be positive", c.rebalanceInterval)
	case c.timeout <= 0:
		return fmt.Errorf("client: group timeout %v must be positive", c.timeout)
	case c.locking && c.broadcasting:
		return errors.New("client: queue locking requires clustering, not broadcasting")
	case c.maxReconsume < 0:
		return fmt.Errorf("client: max reconsume times %d must not be negative", c.maxReconsume)
	case c.locking && (c.lockRenew <= 0 || c.lockValidity <= c.lockRenew):
		return fmt.Errorf("client: lock validity %v must exceed the renew interval %v > 0", c.lockValidity, c.lockRenew)
	}
	if c.listener != nil {
		c.lockLost, _ = c.listener.(LockLossListener)
		if c.locking && c.lockLost == nil {
			return errors.New("client: in locking mode the listener must implement LockLossListener")
		}
	}
	return nil
}

// Lifecycle states of a GroupConsumer.
const (
	groupNew = iota
	groupStarted
	groupClosed
)

// ownedQueue is the state of one owned queue.
type ownedQueue struct {
	lockedUntil time.Time // locking mode: end of this client's validity
	lost        bool      // locking mode: lock lost, not yet reported
}

// GroupConsumer is this client's membership in a RocketMQ consumer group:
// it heartbeats the group's subscriptions, asks brokers for the member
// list, allocates queues among members and, in locking mode, holds broker
// locks on its queues. It tells a RebalanceListener about every change
// (see RebalanceListener for the ordering). It does not pull messages or
// manage offsets: the owner of the assignment does, with the Client's pull
// primitives, typically starting from offsets it checkpoints itself.
//
// Rebalances run at Start, every rebalance interval, when a broker sends
// NOTIFY_CONSUMER_IDS_CHANGED for the group, after a lock loss, and (in
// locking mode) soon again while assigned queues wait for their locks. A
// failed member-list or route request keeps the current assignment of
// that topic: errors never drop queues.
//
// Exclusive ownership. RocketMQ rebalancing is eventually consistent: each
// member computes its share from the member list it last saw, and lists
// seen by different members can differ for a while. Without locking, two
// members can therefore both believe they own a queue until both have
// rebalanced (which a membership notification makes quick but not
// atomic). In locking mode the broker lock is the fence: a new owner's
// OnAssign waits until LOCK_BATCH_MQ grants the queue, which the broker
// does only after the previous owner unlocked it (after its OnRevoke
// returned) or after its lock expired (60 s after its last renewal, while
// the previous owner stops trusting it after the lock validity, 30 s, and
// reports OnLockLost). So, as long as every member honours OnRevoke and
// OnLockLost, no queue is owned by two members at once in locking mode.
//
// Subscribe, Start, Assignment and Close are safe for concurrent use.
// Start and Close block; Close waits for the GroupConsumer's goroutines.
type GroupConsumer struct {
	c     *Client
	group string
	cfg   groupConfig
	log   *slog.Logger

	// retryRouteUntil: see retryRouteWait (the rebalance goroutine's).
	retryRouteUntil time.Time

	trigger  chan struct{} // coalesced rebalance requests (cap 1)
	lostKick chan struct{} // lock loop → rebalance goroutine: a lock was lost (cap 1)
	quit     chan struct{} // closed by Close
	wg       sync.WaitGroup

	closeOnce sync.Once
	closeErr  error

	// life serialises Start and Close (Close waits for a Start in progress).
	life sync.Mutex

	// lockMu serialises LOCK/UNLOCK requests with changes of the owned set,
	// so that a renewal never re-locks a queue after its unlock. Order:
	// lockMu before mu.
	lockMu sync.Mutex

	mu struct {
		sync.Mutex
		state      int
		subs       map[string]protocol.SubscriptionData // by topic
		owned      map[protocol.MessageQueue]*ownedQueue
		listCursor int // rotates the broker asked for the member list
		unregister func()
		removeNtfy func()
		cancel     context.CancelFunc // ends the goroutines' ctx
	}
}

// NewGroupConsumer returns a GroupConsumer of group on c. It validates the
// options; nothing is sent until Start. The GroupConsumer does not own c:
// close it before c.
func NewGroupConsumer(c *Client, group string, opts ...GroupOption) (*GroupConsumer, error) {
	if c == nil {
		return nil, errors.New("client: nil Client")
	}
	if !validGroupName(group) {
		return nil, fmt.Errorf("client: invalid consumer group name %q (1..%d of [%%|a-zA-Z0-9_-])", group, maxGroupName)
	}
	cfg := groupConfig{
		allocator:         AllocateAveragely(),
		rebalanceInterval: DefaultRebalanceInterval,
		lockRenew:         DefaultLockRenewInterval,
		lockValidity:      DefaultLockValidity,
		timeout:           DefaultGroupTimeout,
		maxReconsume:      DefaultMaxReconsumeTimes,
	}
	for _, o := range opts {
		o.apply(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	g := &GroupConsumer{
		c: c, group: group, cfg: cfg,
		log:      c.logger().With("group", group),
		trigger:  make(chan struct{}, 1),
		lostKick: make(chan struct{}, 1),
		quit:     make(chan struct{}),
	}
	g.mu.subs = make(map[string]protocol.SubscriptionData)
	g.mu.owned = make(map[protocol.MessageQueue]*ownedQueue)
	return g, nil
}

// Group returns the consumer group name.
func (g *GroupConsumer) Group() string { return g.group }

// Subscribe adds (or replaces) the subscription of topic with a TAG
// expression ("*" or "" = all, "a || b" = tags a or b). It must be called
// before Start. The expression is reported to brokers in heartbeats; the
// puller applies it.
func (g *GroupConsumer) Subscribe(topic, expr string) error {
	return g.SubscribeSelector(topic, ByTag(expr))
}

// SubscribeSelector adds (or replaces) the subscription of topic with a
// TAG or SQL92 selector (ByTag, BySQL92). It must be called before Start.
// A SQL92 selector is checked by a broker of the topic at Start
// (CHECK_CLIENT_CONFIG: brokers without property filtering refuse it, as
// do Java brokers without enablePropertyFilter); Pull requests carry
// Selector.Expression and Selector.Type to have the broker filter.
func (g *GroupConsumer) SubscribeSelector(topic string, sel Selector) error {
	if topic == "" || len(topic) > 127 {
		return fmt.Errorf("client: invalid topic name %q", topic)
	}
	sd, err := sel.subscription(topic, time.Now().UnixMilli())
	if err != nil {
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	switch g.mu.state {
	case groupStarted:
		return ErrGroupStarted
	case groupClosed:
		return ErrGroupClosed
	}
	g.mu.subs[topic] = sd
	return nil
}

// Selector returns the selector topic is subscribed with.
func (g *GroupConsumer) Selector(topic string) (Selector, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	sd, ok := g.mu.subs[topic]
	if !ok {
		return Selector{}, false
	}
	return Selector{Type: sd.ExpressionType, Expression: sd.SubString}, true
}

// consumerData is the group's heartbeat entry; called by the Client's
// heartbeat loop.
func (g *GroupConsumer) consumerData() protocol.ConsumerData {
	model := protocol.MessageModelClustering
	if g.cfg.broadcasting {
		model = protocol.MessageModelBroadcasting
	}
	g.mu.Lock()
	subs := slices.Collect(maps.Values(g.mu.subs))
	g.mu.Unlock()
	slices.SortFunc(subs, func(a, b protocol.SubscriptionData) int { return strings.Compare(a.Topic, b.Topic) })
	cd := protocol.ConsumerData{
		GroupName:           g.group,
		ConsumeType:         protocol.ConsumeActively,
		MessageModel:        model,
		ConsumeFromWhere:    protocol.ConsumeFromLastOffset,
		SubscriptionDataSet: subs,
	}
	if g.cfg.consumeType != "" {
		cd.ConsumeType = g.cfg.consumeType
	}
	if g.cfg.consumeFrom != "" {
		cd.ConsumeFromWhere = g.cfg.consumeFrom
	}
	return cd
}

// topics returns the subscribed topics, sorted.
func (g *GroupConsumer) topics() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Sorted(maps.Keys(g.mu.subs))
}

// Start joins the group: it checks that every subscribed topic has a
// route, registers the group for the Client's heartbeats, sends one
// heartbeat round at once and starts the rebalance goroutine (and, in
// locking mode, the lock renewal goroutine). It then waits until the first
// rebalance has completed (its OnAssign returned) or ctx is done; in both
// cases the GroupConsumer runs and must be closed. ctx bounds the route
// lookups and the heartbeat; on their errors the GroupConsumer is left
// unstarted and Start may be retried.
func (g *GroupConsumer) Start(ctx context.Context) error {
	g.life.Lock()
	defer g.life.Unlock()
	g.mu.Lock()
	switch {
	case g.mu.state == groupStarted:
		g.mu.Unlock()
		return ErrGroupStarted
	case g.mu.state == groupClosed:
		g.mu.Unlock()
		return ErrGroupClosed
	case len(g.mu.subs) == 0:
		g.mu.Unlock()
		return ErrNoSubscription
	}
	g.mu.state = groupStarted // reserves Start; undone on failure
	g.mu.Unlock()

	fail := func(err error) error {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.mu.unregister != nil {
			g.mu.unregister()
			g.mu.unregister = nil
		}
		if g.mu.removeNtfy != nil {
			g.mu.removeNtfy()
			g.mu.removeNtfy = nil
		}
		if g.mu.state == groupStarted {
			g.mu.state = groupNew
		}
		return err
	}
	for _, t := range g.topics() {
		if _, err := g.c.Route(ctx, t); err != nil {
			if isRetryTopic(t) && errors.Is(err, protocol.ErrTopicNotExist) {
				// Brokers create a group's retry topic on its first
				// heartbeat (and on send-back); rebalances find it then.
				continue
			}
			return fail(fmt.Errorf("client: group %s: route of %s: %w", g.group, t, err))
		}
	}
	if err := g.checkSelectors(ctx); err != nil {
		return fail(err)
	}
	unreg := g.c.registerConsumer(g.group, g.consumerData)
	rm := g.c.handleServerRequest(protocol.ReqNotifyConsumerIDsChanged, g.onNotify)
	g.mu.Lock()
	g.mu.unregister, g.mu.removeNtfy = unreg, rm
	g.mu.Unlock()
	if err := g.c.heartbeatNow(ctx); err != nil {
		return fail(fmt.Errorf("client: group %s: heartbeat: %w", g.group, err))
	}
	lctx, cancel := context.WithCancel(context.Background())
	if g.cfg.locking && !g.goStart(lctx, "group-locks", g.lockLoop) {
		cancel()
		return fail(ErrGroupClosed)
	}
	first := make(chan struct{})
	if !g.goStart(lctx, "group-rebalance", func(ctx context.Context) { g.rebalanceLoop(ctx, first) }) {
		cancel()
		g.wg.Wait()
		return fail(ErrGroupClosed)
	}
	g.mu.Lock()
	g.mu.cancel = cancel
	g.mu.Unlock()
	select {
	case <-first:
	case <-ctx.Done():
	}
	return nil
}

// goStart runs fn on a goroutine owned by the Client (joined by its Close)
// and by g (joined by g.Close); fn's ctx ends when either closes.
func (g *GroupConsumer) goStart(lctx context.Context, name string, fn func(ctx context.Context)) bool {
	g.wg.Add(1)
	ok := g.c.goStart(name+"-"+g.group, func(cctx context.Context) {
		defer g.wg.Done()
		ctx, cancel := context.WithCancel(cctx)
		defer cancel()
		stop := context.AfterFunc(lctx, cancel)
		defer stop()
		fn(ctx)
	})
	if !ok {
		g.wg.Done()
	}
	return ok
}

// onNotify handles NOTIFY_CONSUMER_IDS_CHANGED from a broker.
func (g *GroupConsumer) onNotify(_ context.Context, brokerAddr string, req *protocol.Command) *protocol.Command {
	var h protocol.NotifyConsumerIDsChangedRequestHeader
	if err := h.Decode(req); err != nil {
		g.log.Warn("client: bad NOTIFY_CONSUMER_IDS_CHANGED ignored", "broker", brokerAddr, "err", err)
		return nil
	}
	if h.ConsumerGroup == g.group {
		g.log.Debug("client: membership changed", "broker", brokerAddr)
		g.Rebalance()
	}
	return nil
}

// Rebalance asks for a rebalance as soon as the rebalance goroutine is
// free; requests coalesce. It does not block.
func (g *GroupConsumer) Rebalance() {
	select {
	case g.trigger <- struct{}{}:
	default:
	}
}

// Assignment returns the queues this member owns now (in locking mode:
// owns and holds a valid lock on), sorted. The caller owns the slice.
func (g *GroupConsumer) Assignment() []protocol.MessageQueue {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]protocol.MessageQueue, 0, len(g.mu.owned))
	for q, s := range g.mu.owned {
		if !s.lost {
			out = append(out, q)
		}
	}
	slices.SortFunc(out, protocol.MessageQueue.Compare)
	return out
}

// owns reports whether q is owned now (in locking mode: with a lock whose
// validity has not lapsed).
func (g *GroupConsumer) owns(q protocol.MessageQueue) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	s, ok := g.mu.owned[q]
	if !ok || s.lost {
		return false
	}
	return !g.cfg.locking || time.Now().Before(s.lockedUntil)
}

// rebalanceLoop is the rebalance goroutine: it runs the first rebalance,
// closes first, then rebalances on triggers. It is the only caller of the
// listener while the GroupConsumer runs.
func (g *GroupConsumer) rebalanceLoop(ctx context.Context, first chan<- struct{}) {
	g.retryRouteUntil = time.Now().Add(retryRouteWait)
	pending := g.rebalance(ctx)
	close(first)
	retry := firstLockWait
	t := time.NewTimer(g.nextWait(pending, retry))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.quit:
			return
		case <-g.lostKick:
			g.reportLost(ctx)
		case <-g.trigger:
		case <-t.C:
		}
		if ctx.Err() != nil {
			return
		}
		pending = g.rebalance(ctx)
		if pending {
			retry = min(retry*2, maxLockRetry)
		} else {
			retry = firstLockWait
		}
		t.Reset(g.nextWait(pending, retry))
	}
}

func (g *GroupConsumer) nextWait(pending bool, retry time.Duration) time.Duration {
	if pending {
		return min(retry, g.cfg.rebalanceInterval)
	}
	return g.cfg.rebalanceInterval
}

// reportLost removes queues marked lost by the lock loop and reports them.
func (g *GroupConsumer) reportLost(ctx context.Context) {
	g.lockMu.Lock()
	g.mu.Lock()
	var lost []protocol.MessageQueue
	for q, s := range g.mu.owned {
		if s.lost {
			lost = append(lost, q)
			delete(g.mu.owned, q)
		}
	}
	g.mu.Unlock()
	g.lockMu.Unlock()
	if len(lost) == 0 {
		return
	}
	slices.SortFunc(lost, protocol.MessageQueue.Compare)
	g.log.Warn("client: queue locks lost", "queues", len(lost))
	if g.cfg.lockLost != nil {
		g.cfg.lockLost.OnLockLost(ctx, lost)
	}
}

// rebalance computes this member's share of every subscribed topic and
// applies the difference: revoke (listener, then release), then acquire
// (locks in locking mode, then listener). It reports whether some
// allocated queues are still waiting for their locks. It runs on one
// goroutine at a time (the rebalance goroutine, then Close).
func (g *GroupConsumer) rebalance(ctx context.Context) (pending bool) {
	g.reportLost(ctx) // a lost queue is re-acquired like a new one
	self := g.c.ClientID()
	target := make(map[protocol.MessageQueue]bool)
	current := g.ownedSet()
	for _, topic := range g.topics() {
		qs, err := g.allocateTopic(ctx, self, topic)
		if err != nil {
			if isRetryTopic(topic) && errors.Is(err, protocol.ErrTopicNotExist) {
				g.log.Debug("client: the group's retry topic has no route yet", "topic", topic)
				if time.Now().Before(g.retryRouteUntil) {
					pending = true // look again soon, not in a rebalance interval
				}
			} else {
				g.log.Warn("client: rebalance of topic failed; keeping its queues", "topic", topic, "err", err)
			}
			for q := range current {
				if q.Topic == topic {
					target[q] = true
				}
			}
			continue
		}
		for _, q := range qs {
			target[q] = true
		}
	}
	var revoked, added []protocol.MessageQueue
	for q := range current {
		if !target[q] {
			revoked = append(revoked, q)
		}
	}
	for q := range target {
		if !current[q] {
			added = append(added, q)
		}
	}
	slices.SortFunc(revoked, protocol.MessageQueue.Compare)
	slices.SortFunc(added, protocol.MessageQueue.Compare)
	changed := false
	if len(revoked) > 0 {
		g.revoke(ctx, revoked)
		changed = true
	}
	if len(added) > 0 {
		got := g.acquire(ctx, added)
		pending = pending || len(got) < len(added)
		if len(got) > 0 {
			changed = true
			g.log.Info("client: queues assigned", "queues", len(got), "pending", len(added)-len(got))
			if g.cfg.listener != nil {
				g.cfg.listener.OnAssign(ctx, got)
			}
		}
	}
	if changed {
		if err := g.c.heartbeatNow(ctx); err != nil {
			g.log.Warn("client: heartbeat after rebalance failed; the periodic one will follow", "err", err)
		}
	}
	return pending
}

// ownedSet returns the queues owned and not lost.
func (g *GroupConsumer) ownedSet() map[protocol.MessageQueue]bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[protocol.MessageQueue]bool, len(g.mu.owned))
	for q, s := range g.mu.owned {
		if !s.lost {
			out[q] = true
		}
	}
	return out
}

// revoke tells the listener, then forgets the queues and unlocks them.
func (g *GroupConsumer) revoke(ctx context.Context, qs []protocol.MessageQueue) {
	g.log.Info("client: queues revoked", "queues", len(qs))
	if g.cfg.listener != nil {
		g.cfg.listener.OnRevoke(ctx, qs)
	}
	g.lockMu.Lock()
	defer g.lockMu.Unlock()
	g.mu.Lock()
	for _, q := range qs {
		delete(g.mu.owned, q)
	}
	g.mu.Unlock()
	if g.cfg.locking {
		g.unlock(ctx, qs)
	}
}

// acquire makes qs owned (in locking mode only those whose lock was
// granted) and returns them, sorted.
func (g *GroupConsumer) acquire(ctx context.Context, qs []protocol.MessageQueue) []protocol.MessageQueue {
	g.lockMu.Lock()
	defer g.lockMu.Unlock()
	var until time.Time
	if g.cfg.locking {
		sent := time.Now()
		qs = g.lock(ctx, qs)
		until = sent.Add(g.cfg.lockValidity)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, q := range qs {
		g.mu.owned[q] = &ownedQueue{lockedUntil: until}
	}
	return qs
}

// allocateTopic returns this member's share of topic's queues.
func (g *GroupConsumer) allocateTopic(ctx context.Context, self, topic string) ([]protocol.MessageQueue, error) {
	rctx, cancel := context.WithTimeout(ctx, g.cfg.timeout)
	defer cancel()
	route, err := g.c.Route(rctx, topic)
	if err != nil {
		return nil, fmt.Errorf("route: %w", err)
	}
	queues := slices.Clone(route.SubscribeQueues())
	slices.SortFunc(queues, protocol.MessageQueue.Compare)
	queues = slices.Compact(queues)
	if g.cfg.broadcasting {
		return queues, nil
	}
	members, err := g.members(rctx, route)
	if err != nil {
		return nil, err
	}
	if _, ok := slices.BinarySearch(members, self); !ok {
		return nil, fmt.Errorf("%w (%d members)", errNotMember, len(members))
	}
	got := g.cfg.allocator.Allocate(self, members, queues)
	// Defend against a faulty custom Allocator: only known queues, once.
	out := make([]protocol.MessageQueue, 0, len(got))
	for _, q := range got {
		if _, ok := slices.BinarySearchFunc(queues, q, protocol.MessageQueue.Compare); ok && !slices.Contains(out, q) {
			out = append(out, q)
		}
	}
	return out, nil
}

// members asks brokers of route for the group's member list, trying each
// broker (starting from a rotating one) until one answers. The list is
// sorted and de-duplicated.
func (g *GroupConsumer) members(ctx context.Context, route *TopicRoute) ([]string, error) {
	names := route.BrokerNames()
	if len(names) == 0 {
		return nil, errors.New("client: route has no broker")
	}
	g.mu.Lock()
	start := g.mu.listCursor % len(names)
	g.mu.listCursor++
	g.mu.Unlock()
	var errs []error
	for i := range names {
		name := names[(start+i)%len(names)]
		addr, ok := route.MasterAddr(name)
		if !ok {
			errs = append(errs, fmt.Errorf("broker %s has no master", name))
			continue
		}
		ids, err := g.consumerList(ctx, addr)
		if err != nil {
			errs = append(errs, fmt.Errorf("consumer list from %s (%s): %w", name, addr, err))
			continue
		}
		return ids, nil
	}
	return nil, errors.Join(errs...)
}

// consumerList sends GET_CONSUMER_LIST_BY_GROUP to addr.
func (g *GroupConsumer) consumerList(ctx context.Context, addr string) ([]string, error) {
	req := protocol.NewRequest(protocol.ReqGetConsumerListByGroup)
	h := protocol.GetConsumerListByGroupRequestHeader{ConsumerGroup: g.group}
	h.Encode(req)
	resp, err := g.c.invoke(ctx, addr, req)
	if err != nil {
		return nil, err
	}
	if err := protocol.ResponseError(resp); err != nil {
		return nil, err
	}
	var body protocol.GetConsumerListByGroupResponseBody
	if err := body.Decode(resp.Body); err != nil {
		return nil, err
	}
	ids := body.ConsumerIDList
	if len(ids) == 0 {
		return nil, errors.New("client: empty consumer list")
	}
	if len(ids) > maxMembers {
		return nil, fmt.Errorf("client: consumer list of %d members exceeds %d", len(ids), maxMembers)
	}
	ids = slices.DeleteFunc(ids, func(s string) bool { return s == "" })
	slices.Sort(ids)
	return slices.Compact(ids), nil
}

// Close leaves the group: it stops the GroupConsumer's goroutines,
// reports queues whose lock was lost, revokes every owned queue
// (OnRevoke, which must return first), unlocks them in locking mode,
// unregisters the group from the brokers (UNREGISTER_CLIENT, so that they
// notify the other members at once) and from the Client's heartbeats,
// and sends a last heartbeat. Each request is bounded by the group
// timeout. Close is idempotent and safe from any goroutine except a
// listener call (it waits for the rebalance goroutine); later calls return
// the first call's result.
func (g *GroupConsumer) Close() error {
	g.closeOnce.Do(func() { g.closeErr = g.close() })
	return g.closeErr
}

func (g *GroupConsumer) close() error {
	g.life.Lock()
	defer g.life.Unlock()
	g.mu.Lock()
	wasStarted := g.mu.state == groupStarted
	g.mu.state = groupClosed
	cancel := g.mu.cancel
	g.mu.Unlock()
	close(g.quit)
	if cancel != nil {
		cancel()
	}
	g.wg.Wait()
	if !wasStarted {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*g.cfg.timeout)
	defer cancel()
	g.reportLost(ctx)
	if owned := g.ownedSet(); len(owned) > 0 {
		qs := slices.SortedFunc(maps.Keys(owned), protocol.MessageQueue.Compare)
		g.revoke(ctx, qs)
	}
	g.mu.Lock()
	unreg, rm := g.mu.unregister, g.mu.removeNtfy
	g.mu.unregister, g.mu.removeNtfy = nil, nil
	g.mu.Unlock()
	if rm != nil {
		rm()
	}
	if unreg != nil {
		unreg()
	}
	err := g.unregisterFromBrokers(ctx)
	if herr := g.c.heartbeatNow(ctx); herr != nil && !errors.Is(herr, ErrClosed) {
		err = errors.Join(err, fmt.Errorf("client: group %s: final heartbeat: %w", g.group, herr))
	}
	return err
}

// unregisterFromBrokers sends UNREGISTER_CLIENT for the group to every
// broker address of the subscribed topics.
func (g *GroupConsumer) unregisterFromBrokers(ctx context.Context) error {
	addrs := make(map[string]bool)
	for _, t := range g.topics() {
		route, err := g.c.Route(ctx, t)
		if err != nil {
			continue // no route: no broker to tell; channel expiry will do
		}
		for _, bn := range route.BrokerNames() {
			if a, ok := route.MasterAddr(bn); ok {
				addrs[a] = true
			}
		}
	}
	var errs []error
	for _, a := range slices.Sorted(maps.Keys(addrs)) {
		req := protocol.NewRequest(protocol.ReqUnregisterClient)
		h := protocol.UnregisterClientRequestHeader{ClientID: g.c.ClientID(), ConsumerGroup: g.group}
		h.Encode(req)
		rctx, cancel := context.WithTimeout(ctx, g.cfg.timeout)
		resp, err := g.c.invoke(rctx, a, req)
		cancel()
		if err == nil {
			err = protocol.ResponseError(resp)
		}
		if err != nil && !errors.Is(err, ErrClosed) {
			errs = append(errs, fmt.Errorf("client: group %s: unregister from %s: %w", g.group, a, err))
		}
	}
	return errors.Join(errs...)
}
