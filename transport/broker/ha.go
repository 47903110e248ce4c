package broker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/runnel-dev/runnel/transport/broker/internal/store"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// Role is a broker's part in a master/slave pair (RocketMQ's brokerRole).
type Role int

const (
	// RoleAsyncMaster (the default) answers a send once it stored it;
	// slaves copy its log in the background.
	RoleAsyncMaster Role = iota
	// RoleSyncMaster answers a send once a slave has it too, waiting at
	// most the slave timeout (WithSlaveTimeout): then, or when no slave is
	// in sync, the send is stored but answered FLUSH_SLAVE_TIMEOUT or
	// SLAVE_NOT_AVAILABLE.
	RoleSyncMaster
	// RoleSlave copies a master's log and metadata, refuses sends and
	// serves pulls and queries.
	RoleSlave
)

// String returns RocketMQ's name of r: ASYNC_MASTER, SYNC_MASTER or SLAVE.
func (r Role) String() string {
	switch r {
	case RoleAsyncMaster:
		return "ASYNC_MASTER"
	case RoleSyncMaster:
		return "SYNC_MASTER"
	case RoleSlave:
		return "SLAVE"
	}
	return fmt.Sprintf("Role(%d)", int(r))
}

// ParseRole parses a role: RocketMQ's names (ASYNC_MASTER, SYNC_MASTER,
// SLAVE) or the lower-case, dashed forms (async-master, sync-master, slave).
func ParseRole(s string) (Role, error) {
	switch strings.ReplaceAll(strings.ToUpper(strings.TrimSpace(s)), "-", "_") {
	case "ASYNC_MASTER":
		return RoleAsyncMaster, nil
	case "SYNC_MASTER":
		return RoleSyncMaster, nil
	case "SLAVE":
		return RoleSlave, nil
	}
	return 0, fmt.Errorf("%w: role %q: want async-master, sync-master or slave", ErrInvalidOption, s)
}

// Defaults of the HA options (RocketMQ's MessageStoreConfig values).
const (
	// DefaultSlaveTimeout bounds a SYNC_MASTER's wait for a slave (Java
	// slaveTimeout).
	DefaultSlaveTimeout = 3 * time.Second
	// DefaultHAMaxGap is how far a slave may fall behind and still count
	// as in sync (Java haMaxGapNotInSync, 256 MiB).
	DefaultHAMaxGap = 256 << 20
	// DefaultHAHeartbeat is how often an idle HA connection carries a
	// heartbeat each way (Java haSendHeartbeatInterval).
	DefaultHAHeartbeat = 5 * time.Second
	// DefaultHAHousekeeping is how long an HA connection may stay silent
	// before it is closed (Java haHousekeepingInterval).
	DefaultHAHousekeeping = 20 * time.Second
	// DefaultHABatchBytes bounds the log entries of one transfer frame
	// (Java haTransferBatchSize is 32 KiB).
	DefaultHABatchBytes = 256 << 10
	// DefaultSlaveSyncInterval is how often a slave copies its master's
	// topic configs, consumer offsets, delay offsets and subscription
	// groups (Java SlaveSynchronize, every 10 s).
	DefaultSlaveSyncInterval = 10 * time.Second
	// DefaultSlaveReadLag is how far (log bytes) a pull may be behind the
	// master's log end before the master suggests reading from a slave:
	// the log runnel's store keeps in memory (memtables and block cache).
	// Java's rule uses 40 % of the machine's memory, the page cache its
	// commit log lives in.
	DefaultSlaveReadLag = 128 << 20
)

// haConfig is the HA part of config.
type haConfig struct {
	role         Role
	roleSet      bool
	brokerID     int64
	listen       string // master: HA listen address ("" = listen host, port+1)
	masterHA     string // slave: the master's HA address ("" = from the name servers)
	slaveTimeout time.Duration
	maxGap       int64
	heartbeat    time.Duration
	housekeeping time.Duration
	batchBytes   int
	syncInterval time.Duration
	slaveRead    bool
	slaveReadLag int64
	control      func(ctx context.Context, offset int64, size int) error
}

func defaultHAConfig() haConfig {
	return haConfig{
		slaveTimeout: DefaultSlaveTimeout,
		maxGap:       DefaultHAMaxGap,
		heartbeat:    DefaultHAHeartbeat,
		housekeeping: DefaultHAHousekeeping,
		batchBytes:   DefaultHABatchBytes,
		syncInterval: DefaultSlaveSyncInterval,
		slaveRead:    true,
		slaveReadLag: DefaultSlaveReadLag,
	}
}

func (h *haConfig) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidOption, fmt.Sprintf(format, args...))
	}
	switch {
	case h.role != RoleAsyncMaster && h.role != RoleSyncMaster && h.role != RoleSlave:
		return bad("role %d", h.role)
	case h.role == RoleSlave && h.brokerID <= 0:
		return bad("a slave's broker id must be above 0 (WithBrokerID), not %d", h.brokerID)
	case h.role != RoleSlave && h.brokerID != 0:
		return bad("a master's broker id is 0, not %d", h.brokerID)
	case h.role == RoleSlave && h.listen != "":
		return bad("WithHAListenAddr is for masters; a slave dials its master (WithMasterHAAddr)")
	case h.role != RoleSlave && h.masterHA != "":
		return bad("WithMasterHAAddr is for slaves")
	case h.slaveTimeout <= 0:
		return bad("slave timeout %v must be positive", h.slaveTimeout)
	case h.maxGap <= 0:
		return bad("HA max gap %d must be positive", h.maxGap)
	case h.heartbeat <= 0 || h.housekeeping <= h.heartbeat:
		return bad("HA heartbeat %v must be positive and below the housekeeping interval %v", h.heartbeat, h.housekeeping)
	case h.batchBytes < 1<<10 || h.batchBytes > protocol.DefaultHAMaxBody/2:
		return bad("HA batch of %d bytes outside [1 KiB, %d]", h.batchBytes, protocol.DefaultHAMaxBody/2)
	case h.syncInterval < 10*time.Millisecond:
		return bad("slave sync interval %v below 10ms", h.syncInterval)
	case h.slaveReadLag <= 0:
		return bad("slave read lag %d must be positive", h.slaveReadLag)
	}
	for _, a := range []string{h.listen, h.masterHA} {
		if a == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(a); err != nil {
			return bad("HA address %q: %v", a, err)
		}
	}
	return nil
}

// WithRole sets the broker's role: RoleAsyncMaster (the default),
// RoleSyncMaster or RoleSlave (which needs WithBrokerID). A master given a
// role listens for slaves on its HA port (WithHAListenAddr; by default the
// listen port + 1, as RocketMQ does); a master left at the default role
// listens only when WithHAListenAddr is given.
func WithRole(r Role) Option {
	return optionFunc(func(c *config) { c.ha.role, c.ha.roleSet = r, true })
}

// WithBrokerID sets the broker id a slave registers with (above 0; slaves
// of one master need distinct ids). A master's id is always 0.
func WithBrokerID(id int64) Option { return optionFunc(func(c *config) { c.ha.brokerID = id }) }

// WithHAListenAddr sets the address a master listens on for its slaves
// ("host:port"; port 0 picks a free port). Default: the listen host with
// the listen port + 1 (port 0 when the listen port is 0).
func WithHAListenAddr(addr string) Option { return optionFunc(func(c *config) { c.ha.listen = addr }) }

// WithMasterHAAddr sets the HA address of a slave's master. Default: the
// one the name servers answer the slave's registration with (the master's
// registered HA address), as RocketMQ slaves learn it.
func WithMasterHAAddr(addr string) Option {
	return optionFunc(func(c *config) { c.ha.masterHA = addr })
}

// WithSlaveTimeout bounds how long a SYNC_MASTER waits for a slave to have
// a message before it answers FLUSH_SLAVE_TIMEOUT (default 3 s), and
// maxGap how far (log bytes, default 256 MiB) the slaves may be behind and
// the master still wait: beyond it, or with no slave connected, a send is
// answered SLAVE_NOT_AVAILABLE at once (Java slaveTimeout and
// haMaxGapNotInSync). Either way the message is stored.
func WithSlaveTimeout(d time.Duration, maxGap int64) Option {
	return optionFunc(func(c *config) { c.ha.slaveTimeout, c.ha.maxGap = d, maxGap })
}

// WithHAIntervals sets how often an idle HA connection carries a heartbeat
// each way (default 5 s) and how long one may stay silent before it is
// closed (default 20 s, above the heartbeat), and the most log bytes of one
// transfer frame (default 256 KiB); for tests.
func WithHAIntervals(heartbeat, housekeeping time.Duration, batchBytes int) Option {
	return optionFunc(func(c *config) {
		c.ha.heartbeat, c.ha.housekeeping, c.ha.batchBytes = heartbeat, housekeeping, batchBytes
	})
}

// WithSlaveSyncInterval sets how often a slave copies its master's topic
// configs, consumer offsets, delay offsets and subscription groups
// (default 10 s, as RocketMQ).
func WithSlaveSyncInterval(d time.Duration) Option {
	return optionFunc(func(c *config) { c.ha.syncInterval = d })
}

// WithSlaveRead sets RocketMQ's slaveReadEnable (default true here; false
// in Java) and the lag that makes a master suggest a slave: with it on, a
// pull that ends more than lag log bytes behind the master's log end is
// answered with suggestWhichBrokerId = the group's whichBrokerWhenConsumeSlowly
// (1 by default), other pulls with the group's brokerId (0); a slave serves
// pulls and sends a consumer that has caught up back to a live master
// (suggestWhichBrokerId 0). With it off, masters always suggest 0 and a
// slave refuses pulls with SYSTEM_BUSY, as a Java 5 slave does.
func WithSlaveRead(enabled bool, lag int64) Option {
	return optionFunc(func(c *config) { c.ha.slaveRead, c.ha.slaveReadLag = enabled, lag })
}

// WithHAControl installs a fault hook on a slave's replication: fn is
// called with the physical offset and size of every transfer frame before
// the slave appends it. Returning an error drops the HA connection (as a
// network failure would; the slave reconnects after its backoff); blocking
// stalls the slave (it stops reading: the master's writer then blocks on
// the full socket until its write deadline). ctx ends when the broker
// stops. For tests and fault drills.
func WithHAControl(fn func(ctx context.Context, offset int64, size int) error) Option {
	return optionFunc(func(c *config) { c.ha.control = fn })
}

// isSlave reports whether the broker is a slave.
func (b *Broker) isSlave() bool { return b.cfg.ha.role == RoleSlave }

// brokerID is the id the broker registers with.
func (b *Broker) brokerID() int64 { return b.cfg.ha.brokerID }

// haListening reports whether a master listens for slaves.
func (c *config) haListening() bool {
	return c.ha.role != RoleSlave && (c.ha.roleSet || c.ha.listen != "")
}

// haListenAddr is the address a master's HA listener binds.
func (c *config) haListenAddr() (string, error) {
	if c.ha.listen != "" {
		return c.ha.listen, nil
	}
	host, port, err := net.SplitHostPort(c.listenAddr)
	if err != nil {
		return "", err
	}
	p, err := net.LookupPort("tcp", port)
	if err != nil {
		return "", err
	}
	if p != 0 {
		p++
	}
	return net.JoinHostPort(host, fmt.Sprint(p)), nil
}

// startHA starts the master's HA listener or the slave's replication and
// metadata sync. Called by start once the store is open and the broker's
// address known.
func (b *Broker) startHA(ctx context.Context) error {
	switch {
	case b.isSlave():
		b.slave = newHASlave(b)
		b.goOwned("ha-slave", b.slave.run)
		b.goOwned("ha-sync", b.slave.runSync)
		return nil
	case b.cfg.haListening():
		m, err := newHAMaster(ctx, b)
		if err != nil {
			return err
		}
		b.master = m
		b.goOwned("ha-accept", m.serve)
		b.goOwned("ha-waiters", m.waiters.run)
		return nil
	}
	return nil
}

// startMasterLog gives a master's log its id and a new epoch (every start
// of a master begins one, so that a slave can tell a tail the master lost
// from records it has in common with it).
func (b *Broker) startMasterLog() error {
	if b.isSlave() {
		return nil
	}
	if _, err := b.store.EnsureLogID(); err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	ep, err := b.store.StartEpoch()
	if err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	b.epoch = ep
	return nil
}

// notifyLog is the store's Notify hook: long polling, then the HA
// connections that stream new log entries.
func (b *Broker) notifyLog(topic string, queue int32, maxOffset int64) {
	b.lp.notify(topic, queue, maxOffset)
	if m := b.master; m != nil {
		m.logGrew()
	}
}

// HAStatus is a snapshot of a broker's replication (GET_BROKER_HA_STATUS
// and `runnel broker status` show it; package otel exports it).
type HAStatus struct {
	Role     Role
	BrokerID int64
	// LogEnd is the broker's log end (physical offset of the next record).
	LogEnd int64
	// Epoch is the master's current epoch (0 on a slave).
	Epoch int32
	// HAAddr is a master's HA listen address ("" when it does not listen).
	HAAddr string
	// Slaves are a master's connected slaves.
	Slaves []SlaveStatus
	// Master is a slave's replication client.
	Master *MasterLink
	// SyncWaiting is how many sends a SYNC_MASTER holds for its slaves now;
	// SyncTimeouts and SlaveNotAvailable count the sends answered
	// FLUSH_SLAVE_TIMEOUT and SLAVE_NOT_AVAILABLE.
	SyncWaiting, SyncTimeouts, SlaveNotAvailable int64
}

// SlaveStatus is one slave connected to a master.
type SlaveStatus struct {
	BrokerID int64
	Addr     string // the slave's broker address (its HA connection's peer when unknown)
	// AckOffset is the log end the slave reported (-1 before its first
	// report); Lag is the master's log end minus it.
	AckOffset, Lag int64
	InSync         bool
	// BytesSent counts the log bytes sent to this slave id since the
	// master started (across its reconnections); BytesPerSecond is their
	// rate (GET_BROKER_HA_STATUS's transferredByteInSecond: the bytes of
	// the last whole second, as Java's FlowMonitor counts). NextOffset is
	// where the next transfer starts.
	BytesSent, BytesPerSecond, NextOffset int64
	// BufferBytes is what the master holds in memory for the slave: its
	// writer's one frame buffer (the batch size plus room for a record),
	// however far behind the slave is; the rest is read from the store.
	BufferBytes int64
	Since       time.Time
}

// MasterLink is a slave's view of its master.
type MasterLink struct {
	MasterAddr, MasterHAAddr string
	Connected                bool
	// MasterLogEnd is the master's log end as last heard; Lag is it minus
	// the slave's log end.
	MasterLogEnd, Lag int64
	// BytesReceived counts the log bytes received since the slave
	// started, BytesPerSecond their rate (as SlaveStatus's); LastRead and
	// LastWrite are the last frame read from and the last report written
	// to the master.
	BytesReceived, BytesPerSecond int64
	LastRead, LastWrite           time.Time
	// From is where the current (or last) connection's transfer started:
	// the slave's log end then.
	From int64
	// LastError is why the last connection failed or was refused ("" when
	// none did).
	LastError string
	// Truncations counts the repairs of a log that had diverged from the
	// master's (records removed from LastTruncatedAt on).
	Truncations     int64
	LastTruncatedAt int64
}

// HAStatus returns the broker's replication status (zero before Start).
// Safe for concurrent use.
func (b *Broker) HAStatus() HAStatus {
	st := HAStatus{Role: b.cfg.ha.role, BrokerID: b.cfg.ha.brokerID}
	if b.state.Load() == stateNew || b.store == nil {
		return st
	}
	st.LogEnd = b.store.LogEnd()
	if m := b.master; m != nil {
		m.status(&st)
	}
	if s := b.slave; s != nil {
		st.Master = s.status(st.LogEnd)
	}
	return st
}

// processHAStatus serves GET_BROKER_HA_STATUS (907): Java's HARuntimeInfo.
func (b *Broker) processHAStatus(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	st := b.HAStatus()
	info := protocol.HARuntimeInfo{Master: st.Role != RoleSlave, MasterCommitLogMaxOffset: st.LogEnd}
	for _, s := range st.Slaves {
		if s.InSync {
			info.InSyncSlaveNums++
		}
		info.HAConnectionInfo = append(info.HAConnectionInfo, protocol.HAConnectionRuntimeInfo{
			Addr: s.Addr, SlaveAckOffset: s.AckOffset, Diff: s.Lag, InSync: s.InSync,
			TransferredByteInSecond: s.BytesPerSecond, TransferFromWhere: s.NextOffset,
		})
	}
	if ml := st.Master; ml != nil {
		info.MasterCommitLogMaxOffset = 0
		info.HAClientRuntimeInfo = protocol.HAClientRuntimeInfo{
			MasterAddr: ml.MasterHAAddr, TransferredByteInSecond: ml.BytesPerSecond, MaxOffset: st.LogEnd, MasterFlushOffset: ml.MasterLogEnd,
			LastReadTimestamp: unixMilli(ml.LastRead), LastWriteTimestamp: unixMilli(ml.LastWrite),
		}
	}
	body, err := info.Encode()
	if err != nil {
		return nil, err
	}
	resp := respond(req, protocol.ResSuccess, "")
	resp.Body = body
	return resp, nil
}

func unixMilli(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// errDiverged is wrapped when a slave's log cannot be reconciled with its
// master's.
var errDiverged = errors.New("broker: the slave's log diverged from its master's")

// consistentPoint returns where a slave's log stops agreeing with its
// master's (AutoSwitch EpochFileCache.findConsistentPoint): the end of the
// last epoch both logs have (same number, same start offset), at the lower
// of the two logs' ends of that epoch. ok is false when they share no
// epoch. An epoch ends where the next one starts, the last one at its
// log's end.
func consistentPoint(local []store.Epoch, localEnd int64, master []protocol.HAEpoch, masterEnd int64) (int64, bool) {
	endOf := func(i int, starts func(int) int64, n int, logEnd int64) int64 {
		if i+1 < n {
			return min(starts(i+1), logEnd)
		}
		return logEnd
	}
	for i := len(local) - 1; i >= 0; i-- {
		for j := len(master) - 1; j >= 0; j-- {
			if master[j].Epoch != local[i].Epoch {
				continue
			}
			if master[j].StartOffset != local[i].StartOffset {
				break // same number, another history: look further back
			}
			le := endOf(i, func(k int) int64 { return local[k].StartOffset }, len(local), localEnd)
			me := endOf(j, func(k int) int64 { return master[k].StartOffset }, len(master), masterEnd)
			return min(le, me), true
		}
	}
	return 0, false
}

// advertisedHost returns the advertised host with port p.
func (b *Broker) advertisedHost(p uint16) string {
	return netip.AddrPortFrom(b.host.Addr(), p).String()
}
