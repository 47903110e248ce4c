package broker

import (
	"context"
	"time"

	"github.com/runnel-dev/runnel/transport/remoting"
)

// The client-facing subsystems of the broker (client registry, queue
// locks, retry/DLQ, delay/timer delivery, reply push) plug into the core
// through the extensions seam (broker.go).
//
// # Concurrency
//
// clientRegistry.mu and lockManager.mu each guard only their own maps. They
// are never nested, and never held while calling into the core
// (groupConfig, ensureTopic, storeInternal) or while writing to a
// connection: notifications and reply pushes are queued on bounded channels
// and sent by goroutines of their own. The scheduler's progress is owned by
// its goroutine; its send-path half (rewrite) reads configuration only.
// Every goroutine here is started through extensions.start and joined by
// the broker at shutdown: housekeeping, the notifier, the scheduler,
// replyWorkers reply pushers and the admin rate sampler.
//
// # Time
//
// Delays, expiries and lock lifetimes are measured on the broker's clock
// (WithClock), so a test clock that jumps ahead makes them pass at once;
// the loops wake on real-time tickers (housekeepTick, scheduleTick).

// subsystemConfig holds the knobs of the client-facing subsystems. Every
// duration is measured on the broker's clock (WithClock) except the tick
// periods, which are real time.
type subsystemConfig struct {
	channelExpiry  time.Duration   // no heartbeat for this long: channel removed (Java 120 s)
	channelScan    time.Duration   // expiry scan period, on the broker's clock (Java 10 s)
	housekeepTick  time.Duration   // real-time period of the housekeeping loop
	lockExpiry     time.Duration   // queue lock lifetime without renewal (Java 60 s)
	delayLevels    []time.Duration // delay of level 1, 2, … (Java messageDelayLevel)
	scheduleTick   time.Duration   // real-time period of the delivery loop (Java 100 ms)
	timerMaxDelay  time.Duration   // longest timer delay (Java timerMaxDelaySec, 3 days)
	timerPrecision time.Duration   // deliver times are rounded down to this (Java 1 s)
	replyTimeout   time.Duration   // PUSH_REPLY_MESSAGE_TO_CLIENT call timeout (Java 10 s)
}

func defaultSubsystemConfig() subsystemConfig {
	return subsystemConfig{
		channelExpiry:  120 * time.Second,
		channelScan:    10 * time.Second,
		housekeepTick:  time.Second,
		lockExpiry:     60 * time.Second,
		delayLevels:    defaultDelayLevels(),
		scheduleTick:   100 * time.Millisecond,
		timerMaxDelay:  72 * time.Hour,
		timerPrecision: time.Second,
		replyTimeout:   10 * time.Second,
	}
}

// subsystems are the client-facing parts of the broker: client registry,
// queue locks, retry/DLQ, delay/timer delivery and reply push.
type subsystems struct {
	b       *Broker
	clients *clientRegistry
	locks   *lockManager
	sched   *scheduler
	retry   *retrier
	replies *replyPusher
	admin   *adminOps
	pop     *popService // pop.go
}

func newSubsystems(b *Broker, cfg subsystemConfig) *subsystems {
	s := &subsystems{b: b}
	s.clients = newClientRegistry(b, &cfg)
	s.locks = newLockManager(b, &cfg)
	s.sched = newScheduler(b, &cfg)
	s.retry = newRetrier(b, s.locks, s.sched)
	s.replies = newReplyPusher(b, s.clients, &cfg)
	s.admin = newAdminOps(b, s.clients)
	s.pop = newPopService(b, b.cfg.pop)
	s.pop.clients = s.clients
	b.pop = s.pop
	return s
}

// newExtensions builds the subsystems the core broker delegates to and
// plugs them into the seam.
func newExtensions(b *Broker) extensions {
	return newSubsystems(b, b.cfg.sub).extensions()
}

func (s *subsystems) extensions() extensions {
	ext := extensions{
		register: []func(*remoting.Server){
			s.clients.register,
			s.locks.register,
			s.retry.register,
			s.admin.register,
			s.pop.register,
		},
		start: []func(context.Context){
			s.housekeeping,
			s.clients.runNotifier,
			s.sched.run,
			s.admin.runSampler,
			s.pop.reviveLoop,
			s.pop.waiters.run,
		},
		subscription:     s.clients.subscription,
		producerChannels: s.clients.producerChannels,
		beforeStore:      s.beforeStore,
		afterStore:       s.replies.afterStore,
		onDisconnect:     s.clients.removeConn,
	}
	for range replyWorkers {
		ext.start = append(ext.start, s.replies.run)
	}
	return ext
}

// beforeStore applies the retry/DLQ rules, then the delay and timer
// rewrite, to a message of the send path.
func (s *subsystems) beforeStore(ctx context.Context, m *InboundMessage) error {
	if err := s.retry.beforeStore(ctx, m); err != nil {
		return err
	}
	return s.sched.rewrite(ctx, m)
}

// housekeeping expires silent client channels and stale queue locks, each
// scanPeriod of the broker's clock, checking every housekeepTick of real
// time (so a test clock that jumps is followed promptly).
func (s *subsystems) housekeeping(ctx context.Context) {
	t := time.NewTicker(s.clients.tick)
	defer t.Stop()
	lastScan, lastPurge := s.b.now(), s.b.now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := s.b.now()
		if now.Sub(lastScan) >= s.clients.scan {
			lastScan = now
			s.clients.expire()
		}
		if now.Sub(lastPurge) >= s.locks.expiry {
			lastPurge = now
			s.locks.purgeExpired()
		}
	}
}
