package broker

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runnel-dev/runnel/transport/broker/internal/store"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// haSlave is a slave's side of replication (Java DefaultHAClient with the
// AutoSwitchHAClient handshake): it connects to its master's HA port,
// checks the master is its own (names, log id), repairs its log where it
// diverged (epochs), reports its log end and appends what the master
// streams. runSync (ha_sync.go) copies the master's metadata.
type haSlave struct {
	b       *Broker
	log     *slog.Logger
	syncNow chan struct{} // capacity 1: copy the master's metadata soon
	learned chan struct{} // capacity 1: the name servers named a master

	received    atomic.Int64
	flow        flowMeter
	truncations atomic.Int64
	lastTrunc   atomic.Int64

	mu struct {
		sync.Mutex
		learnedAddr, learnedHA string // from the name servers' registration answer
		hsAddr                 string // the master's broker address from its handshake
		connected              bool
		masterEnd              int64
		lastRead, lastWrite    time.Time
		lastErr                string
		haAddr                 string // the HA address in use
		from                   int64  // where the current connection's transfer started
	}
}

func newHASlave(b *Broker) *haSlave {
	return &haSlave{b: b, log: b.log.With("ha", "slave"), syncNow: make(chan struct{}, 1), learned: make(chan struct{}, 1)}
}

// learn records the master addresses a name server answered the slave's
// registration with.
func (s *haSlave) learn(masterAddr, haAddr string) {
	if masterAddr == "" && haAddr == "" {
		return
	}
	s.mu.Lock()
	changed := s.mu.learnedHA != haAddr || s.mu.learnedAddr != masterAddr
	s.mu.learnedAddr, s.mu.learnedHA = masterAddr, haAddr
	s.mu.Unlock()
	if changed {
		s.log.Info("broker: the name server names the master", "master", masterAddr, "master_ha", haAddr)
		s.syncSoon()
		select {
		case s.learned <- struct{}{}:
		default:
		}
	}
}

func (s *haSlave) syncSoon() {
	select {
	case s.syncNow <- struct{}{}:
	default:
	}
}

// masterHAAddr is the HA address to dial: the configured one, else the
// one learned from the name servers.
func (s *haSlave) masterHAAddr() string {
	if a := s.b.cfg.ha.masterHA; a != "" {
		return a
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.learnedHA
}

// masterAddr is the master's broker address for the metadata copy: from
// the name servers, else from the master's handshake.
func (s *haSlave) masterAddr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.learnedAddr != "" {
		return s.mu.learnedAddr
	}
	return s.mu.hsAddr
}

// masterAlive reports whether the slave hears from its master (an HA
// connection that carried a frame within the housekeeping interval).
func (s *haSlave) masterAlive() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.connected && time.Since(s.mu.lastRead) < s.b.cfg.ha.housekeeping
}

func (s *haSlave) status(logEnd int64) *MasterLink {
	received := s.received.Load()
	s.mu.Lock()
	defer s.mu.Unlock()
	ml := &MasterLink{
		MasterAddr: s.mu.learnedAddr, MasterHAAddr: s.mu.haAddr, Connected: s.mu.connected,
		MasterLogEnd: s.mu.masterEnd, BytesReceived: received, BytesPerSecond: s.flow.perSecond(time.Now()),
		LastRead: s.mu.lastRead, LastWrite: s.mu.lastWrite, LastError: s.mu.lastErr,
		Truncations: s.truncations.Load(), LastTruncatedAt: s.lastTrunc.Load(), From: s.mu.from,
	}
	if ml.MasterAddr == "" {
		ml.MasterAddr = s.mu.hsAddr
	}
	if ml.MasterHAAddr == "" {
		ml.MasterHAAddr = s.b.cfg.ha.masterHA
		if ml.MasterHAAddr == "" {
			ml.MasterHAAddr = s.mu.learnedHA
		}
	}
	ml.Lag = max(ml.MasterLogEnd-logEnd, 0)
	return ml
}

// refusedError is a master's refusal, or the slave's own of its master.
type refusedError struct {
	by, reason string
}

func (e *refusedError) Error() string {
	return "broker: " + e.by + " refused the replication: " + e.reason
}

// run keeps a replication session with the master until ctx ends,
// reconnecting with a backoff (500 ms, doubling to 2 s; Java waits 5 s: a
// SYNC_MASTER answers SLAVE_NOT_AVAILABLE until its slave is back) and
// asking the name servers for the master's address again after a failure.
func (s *haSlave) run(ctx context.Context) {
	const minBackoff, maxBackoff = 500 * time.Millisecond, 2 * time.Second
	backoff := minBackoff
	var asked time.Time // the last registration asked for, to learn the master
	askNameServers := func() {
		if time.Since(asked) >= maxBackoff {
			asked = time.Now()
			s.b.triggerRegister() // the name servers may name another master by now
		}
	}
	for ctx.Err() == nil {
		addr := s.masterHAAddr()
		if addr == "" {
			s.mu.Lock()
			s.mu.lastErr = "no master HA address yet: waiting for the name servers to name this slave's master"
			s.mu.Unlock()
			askNameServers()
			if !s.pause(ctx, maxBackoff) {
				return
			}
			continue
		}
		transferred, err := s.session(ctx, addr)
		if ctx.Err() != nil {
			return
		}
		if transferred {
			backoff = minBackoff
		}
		wait := backoff
		if oe := (*net.OpError)(nil); errors.As(err, &oe) && oe.Op == "dial" {
			// Nobody listens (the master is down or restarting): dialling
			// again is cheap, and a SYNC_MASTER that is back answers
			// SLAVE_NOT_AVAILABLE until its slave is.
			wait = dialRetry
		} else {
			backoff = min(2*backoff, maxBackoff)
		}
		s.mu.Lock()
		s.mu.connected = false
		s.mu.lastErr = err.Error()
		s.mu.Unlock()
		var re *refusedError
		switch {
		case errors.As(err, &re) || errors.Is(err, errDiverged):
			s.log.Error("broker: replication from the master refused", "master_ha", addr, "err", err)
		case wait == dialRetry:
			s.log.Debug("broker: master unreachable; retrying", "master_ha", addr, "retry_in", wait, "err", err)
		default:
			s.log.Warn("broker: replication from the master stopped; retrying", "master_ha", addr, "retry_in", wait, "err", err)
		}
		askNameServers()
		if !s.pause(ctx, wait) {
			return
		}
	}
}

// dialRetry is how soon a slave dials its master again after a dial failed.
const dialRetry = 250 * time.Millisecond

// pause waits d, or less when the name servers name a master; false when
// ctx ended.
func (s *haSlave) pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	case <-s.learned: // a master address: try it at once
	}
	return true
}

// session runs one HA connection; transferred tells whether it got past
// the handshake.
func (s *haSlave) session(ctx context.Context, addr string) (transferred bool, err error) {
	b, st := s.b, s.b.store
	hk := b.cfg.ha.housekeeping
	d := net.Dialer{Timeout: 3 * time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false, err
	}
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	defer c.Close()
	s.mu.Lock()
	s.mu.haAddr = addr
	s.mu.Unlock()
	logID, err := st.LogID()
	if err != nil {
		return false, err
	}
	me := protocol.HAIdentity{Cluster: b.cfg.clusterName, BrokerName: b.cfg.brokerName, BrokerAddr: b.hostStr, LogID: logID}
	frame, err := protocol.AppendHASlaveHandshake(nil, b.cfg.ha.brokerID, me)
	if err != nil {
		return false, err
	}
	var wmu sync.Mutex
	write := func(frame []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		_ = c.SetWriteDeadline(time.Now().Add(hk))
		_, err := c.Write(frame)
		if err == nil {
			s.mu.Lock()
			s.mu.lastWrite = time.Now()
			s.mu.Unlock()
		}
		return err
	}
	if err := write(frame); err != nil {
		return false, err
	}
	br := bufio.NewReaderSize(c, 256<<10)
	_ = c.SetReadDeadline(time.Now().Add(hk))
	f, buf, err := protocol.ReadHAMasterFrame(br, nil, protocol.DefaultHAMaxBody)
	if err != nil {
		return false, fmt.Errorf("broker: HA handshake with %s: %w", addr, err)
	}
	switch f.State {
	case protocol.HAStateShutdown:
		return false, &refusedError{by: "master " + addr, reason: string(f.Body)}
	case protocol.HAStateHandshake:
	default:
		return false, fmt.Errorf("broker: HA handshake with %s: unexpected state %d", addr, f.State)
	}
	mid, mepochs, err := protocol.DecodeHAMasterHandshake(f.Body)
	if err != nil {
		return false, err
	}
	switch {
	case mid.Cluster != b.cfg.clusterName || mid.BrokerName != b.cfg.brokerName:
		return false, &refusedError{by: "slave", reason: fmt.Sprintf("%s is broker %q of cluster %q, not this slave's master (broker %q of cluster %q)",
			addr, mid.BrokerName, mid.Cluster, b.cfg.brokerName, b.cfg.clusterName)}
	case mid.LogID == "":
		return false, &refusedError{by: "slave", reason: addr + " has no log id (not a master)"}
	case logID != "" && logID != mid.LogID:
		return false, &refusedError{by: "slave", reason: fmt.Sprintf("this slave holds the log of another master (log id %s; %s's is %s); start it on an empty data directory to copy this master",
			logID, addr, mid.LogID)}
	}
	if err := s.reconcile(logID, mepochs, f.Offset); err != nil {
		return false, err
	}
	if logID == "" {
		if err := st.SetLogID(mid.LogID); err != nil {
			return false, err
		}
	}
	s.mu.Lock()
	s.mu.hsAddr = mid.BrokerAddr
	s.mu.from = st.LogEnd()
	s.mu.masterEnd = f.Offset
	s.mu.lastRead = time.Now()
	s.mu.connected = true
	s.mu.lastErr = ""
	s.mu.Unlock()
	s.syncSoon()
	if err := write(protocol.AppendHASlaveReport(nil, st.LogEnd())); err != nil {
		return true, err
	}
	s.log.Info("broker: replicating from the master", "master_ha", addr, "master", mid.BrokerAddr, "from", st.LogEnd(), "master_end", f.Offset)

	// Heartbeat reports on their own goroutine, joined before returning.
	hbDone := make(chan struct{})
	hbQuit := make(chan struct{})
	go pprof.Do(ctx, pprof.Labels("broker", "ha-slave-heartbeat"), func(context.Context) {
		defer close(hbDone)
		t := time.NewTicker(b.cfg.ha.heartbeat)
		defer t.Stop()
		for {
			select {
			case <-hbQuit:
				return
			case <-t.C:
				if err := write(protocol.AppendHASlaveReport(nil, st.LogEnd())); err != nil {
					_ = c.Close()
					return
				}
			}
		}
	})
	defer func() {
		close(hbQuit)
		<-hbDone
	}()

	var lastEpoch int32
	if eps, err := st.Epochs(); err != nil {
		return true, err
	} else if len(eps) > 0 {
		lastEpoch = eps[len(eps)-1].Epoch
	}
	var ap applier
	for {
		_ = c.SetReadDeadline(time.Now().Add(hk))
		f, buf, err = protocol.ReadHAMasterFrame(br, buf, protocol.DefaultHAMaxBody)
		if err != nil {
			return true, err
		}
		switch f.State {
		case protocol.HAStateTransfer:
		case protocol.HAStateShutdown:
			return true, &refusedError{by: "master " + addr, reason: string(f.Body)}
		default:
			return true, fmt.Errorf("broker: HA frame with state %d from %s", f.State, addr)
		}
		s.mu.Lock()
		s.mu.lastRead = time.Now()
		s.mu.masterEnd = f.ConfirmOffset
		s.mu.Unlock()
		if len(f.Body) == 0 {
			continue // heartbeat
		}
		if end := st.LogEnd(); f.Offset < end {
			return true, fmt.Errorf("%w: the master sent log from %d, below this slave's end %d", errDiverged, f.Offset, end)
		}
		if f.Epoch > lastEpoch {
			if err := st.AddEpoch(f.Epoch, f.EpochStartOffset); err != nil {
				return true, err
			}
			lastEpoch = f.Epoch
		}
		if fn := b.cfg.ha.control; fn != nil {
			if err := fn(ctx, f.Offset, len(f.Body)); err != nil {
				return true, fmt.Errorf("broker: HA fault hook: %w", err)
			}
		}
		if err := ap.apply(ctx, s, f.Body); err != nil {
			return true, err
		}
		s.received.Add(int64(len(f.Body)))
		s.flow.add(time.Now(), int64(len(f.Body)))
		if err := write(protocol.AppendHASlaveReport(nil, st.LogEnd())); err != nil {
			return true, err
		}
	}
}

// reconcile repairs the slave's log before it asks for more: the part
// past the last point its epochs agree with the master's is removed (an
// ASYNC master that lost its tail in a crash wrote other records there).
func (s *haSlave) reconcile(logID string, mepochs []protocol.HAEpoch, masterEnd int64) error {
	st := s.b.store
	local, err := st.Epochs()
	if err != nil {
		return err
	}
	end := st.LogEnd()
	if end == 0 && len(local) == 0 {
		return nil // a new slave
	}
	if logID == "" {
		return &refusedError{by: "slave", reason: fmt.Sprintf("this slave's data directory holds a log of %d bytes that is no master's copy (it has no log id); start it on an empty data directory", end)}
	}
	point, ok := consistentPoint(local, end, mepochs, masterEnd)
	if !ok {
		return fmt.Errorf("%w: no epoch in common (slave %v, master %v)", errDiverged, local, mepochs)
	}
	if point >= end {
		return nil
	}
	if err := st.TruncateLog(point); err != nil {
		return err
	}
	s.truncations.Add(1)
	s.lastTrunc.Store(point)
	s.log.Warn("broker: the slave's log diverged from the master's: removed its records from the consistent point on",
		"from", point, "removed_bytes", end-point)
	return nil
}

// applier turns a TRANSFER body into store entries (scratch reused across
// frames).
type applier struct {
	entries []store.LogEntry
	keys    []string
	keyEnds []int
	scratch []string
}

// apply appends the entries of body, replaying the master's topic
// deletions at their place in the log.
func (ap *applier) apply(ctx context.Context, s *haSlave, body []byte) error {
	b := s.b
	ap.entries, ap.keys, ap.keyEnds = ap.entries[:0], ap.keys[:0], ap.keyEnds[:0]
	var deletes []string
	unknown := false
	flush := func() error {
		for i := range ap.entries {
			start := 0
			if i > 0 {
				start = ap.keyEnds[i-1]
			}
			ap.entries[i].Keys = ap.keys[start:ap.keyEnds[i]:ap.keyEnds[i]]
		}
		err := b.store.AppendLog(ctx, ap.entries)
		clear(ap.entries)
		ap.entries, ap.keys, ap.keyEnds = ap.entries[:0], ap.keys[:0], ap.keyEnds[:0]
		if err != nil {
			if errors.Is(err, store.ErrLogConflict) {
				return fmt.Errorf("%w: %w", errDiverged, err)
			}
			return err
		}
		for _, t := range deletes {
			if err := b.deleteTopicReplica(t); err != nil {
				return err
			}
		}
		deletes = deletes[:0]
		return nil
	}
	err := protocol.DecodeHALogEntries(body, ap.scratch[:0], func(e *protocol.HALogEntry) error {
		m, _, err := protocol.DecodeRecord(e.Record)
		if err != nil {
			return err
		}
		ap.entries = append(ap.entries, store.LogEntry{
			Phys: m.CommitLogOffset, Topic: m.Topic, QueueID: m.QueueID, QueueOffset: m.QueueOffset,
			Record: e.Record, TagsCode: e.TagsCode, StoreTimestamp: m.StoreTimestamp,
		})
		ap.keys = append(ap.keys, e.Keys...)
		ap.keyEnds = append(ap.keyEnds, len(ap.keys))
		if m.Topic == haOpsTopic {
			if op, _ := m.Property(propHAOp); op == haOpDeleteTopic {
				deletes = append(deletes, string(m.Body))
				return flush()
			}
		} else if _, ok := b.topics.get(m.Topic); !ok {
			unknown = true
		}
		return nil
	})
	if err == nil {
		err = flush()
	}
	if unknown {
		s.syncSoon() // the master created a topic this slave has no config of yet
	}
	return err
}

// The log records of a master's topic deletions.
const (
	// haOpsTopic holds records that tell slaves what to replay beside
	// messages (a system topic: nothing can be sent to it).
	haOpsTopic      = "rmq_sys_runnel_ha_ops"
	propHAOp        = "RUNNEL_HA_OP"
	haOpDeleteTopic = "DELETE_TOPIC"
)

// deleteTopicReplica deletes a topic on a slave where the master's log
// says it was deleted: its messages, offsets and config.
func (b *Broker) deleteTopicReplica(name string) error {
	b.topics.mu.Lock()
	defer b.topics.mu.Unlock()
	if err := b.store.DeleteTopic(name); err != nil {
		return fmt.Errorf("broker: replay the master's deletion of topic %s: %w", name, err)
	}
	if _, ok := b.topics.get(name); ok {
		b.topics.publishLocked(func(m map[string]TopicConfig) { delete(m, name) }, b.now().UnixMilli())
	}
	b.log.Info("broker: topic deleted as on the master", "topic", name)
	return nil
}
