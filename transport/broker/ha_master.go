package broker

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runnel-dev/runnel/transport/broker/internal/store"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// haMaster is a master's side of replication (Java DefaultHAService +
// DefaultHAConnection): it accepts slaves on the HA port, checks who they
// are, streams its log to each from the offset the slave reports, and
// tracks their acknowledgements for the SYNC_MASTER waits.
//
// Memory is bounded per connection: its writer holds one transfer frame
// (at most the batch size plus one record) and blocks in the socket write
// while the slave does not read; a slave that falls behind is fed from the
// store, never from a backlog kept for it.
type haMaster struct {
	b       *Broker
	log     *slog.Logger
	ln      net.Listener
	addr    string // advertised HA address
	logID   string
	waiters *replicaWaiters

	// ackMax is the highest log end any slave reported (Java
	// push2SlaveMaxOffset); it never moves back.
	ackMax atomic.Int64
	// live are the connections past their handshake (copy on write: the
	// store's Notify hook reads it on every commit round).
	live atomic.Pointer[[]*haConn]

	mu struct {
		sync.Mutex
		conns map[*haConn]struct{}
		// bySlave are the transfer counters of each slave id, kept across
		// its reconnections.
		bySlave map[int64]*slaveTotals
	}
	wg sync.WaitGroup // connection goroutines
}

// slaveTotals are the transfer counters of one slave id.
type slaveTotals struct {
	sent atomic.Int64 // log bytes sent since the master started
	flow flowMeter
}

// flowMeter counts bytes per second as Java's FlowMonitor does
// (transferredByteInSecond): the bytes of the last whole second, 0 once a
// second passed without any.
type flowMeter struct {
	mu   sync.Mutex
	sec  time.Time // start of the current second
	cur  int64     // bytes in it so far
	last int64     // bytes in the second before
}

// add counts n bytes at now.
func (f *flowMeter) add(now time.Time, n int64) {
	f.mu.Lock()
	f.roll(now)
	f.cur += n
	f.mu.Unlock()
}

// perSecond returns the bytes of the last whole second before now.
func (f *flowMeter) perSecond(now time.Time) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.roll(now)
	return f.last
}

func (f *flowMeter) roll(now time.Time) {
	switch d := now.Sub(f.sec); {
	case f.sec.IsZero():
		f.sec = now
	case d >= 2*time.Second:
		f.sec, f.cur, f.last = now, 0, 0
	case d >= time.Second:
		f.sec, f.cur, f.last = f.sec.Add(time.Second), 0, f.cur
	}
}

// haConn is one slave connection.
type haConn struct {
	m       *haMaster
	c       net.Conn
	peer    string
	slaveID int64
	addr    string // the slave's broker address (from its handshake)
	since   time.Time
	wake    chan struct{} // capacity 1: new log entries
	quit    chan struct{} // closed when the reader ends
	first   chan int64    // the slave's first report: where to start
	ack     atomic.Int64  // last reported log end, -1 before the first report
	next    atomic.Int64  // next offset to transfer
	buffer  atomic.Int64  // capacity of the writer's frame buffer
	totals  *slaveTotals  // of slaveID; set before the connection is live
	wmu     sync.Mutex    // socket writes
}

func newHAMaster(ctx context.Context, b *Broker) (*haMaster, error) {
	addr, err := b.cfg.haListenAddr()
	if err != nil {
		return nil, fmt.Errorf("broker: HA listen address: %w", err)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("broker: HA listen %s: %w", addr, err)
	}
	logID, err := b.store.LogID()
	if err != nil {
		return nil, errors.Join(fmt.Errorf("broker: %w", err), ln.Close())
	}
	m := &haMaster{b: b, log: b.log.With("ha", "master"), ln: ln, logID: logID,
		addr: b.advertisedHost(uint16(ln.Addr().(*net.TCPAddr).Port))}
	m.ackMax.Store(-1)
	m.mu.conns = map[*haConn]struct{}{}
	m.mu.bySlave = map[int64]*slaveTotals{}
	m.live.Store(&[]*haConn{})
	m.waiters = newReplicaWaiters(m)
	return m, nil
}

// serve accepts slave connections until ctx ends, then closes them all
// and waits for their goroutines.
func (m *haMaster) serve(ctx context.Context) {
	stop := context.AfterFunc(ctx, func() { _ = m.ln.Close() })
	defer stop()
	for {
		c, err := m.ln.Accept()
		if err != nil {
			if ctx.Err() == nil {
				m.log.Error("broker: HA listener stopped accepting", "err", err)
			}
			break
		}
		hc := &haConn{m: m, c: c, peer: c.RemoteAddr().String(), since: m.b.now(),
			wake: make(chan struct{}, 1), quit: make(chan struct{}), first: make(chan int64, 1)}
		hc.ack.Store(-1)
		m.mu.Lock()
		m.mu.conns[hc] = struct{}{}
		m.mu.Unlock()
		m.wg.Add(1)
		go pprof.Do(ctx, pprof.Labels("broker", "ha-conn", "peer", hc.peer), func(ctx context.Context) {
			defer m.wg.Done()
			hc.serve(ctx)
		})
	}
	_ = m.ln.Close()
	m.mu.Lock()
	for hc := range m.mu.conns {
		_ = hc.c.Close()
	}
	m.mu.Unlock()
	m.wg.Wait()
	m.waiters.close()
}

// logGrew wakes every connection's writer (the store's Notify hook; it
// must not block).
func (m *haMaster) logGrew() {
	for _, hc := range *m.live.Load() {
		select {
		case hc.wake <- struct{}{}:
		default:
		}
	}
}

func (m *haMaster) setLive(hc *haConn, on bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	cur := *m.live.Load()
	next := slices.DeleteFunc(slices.Clone(cur), func(c *haConn) bool { return c == hc })
	if on {
		// A slave that reconnects replaces its old connection (a restarted
		// slave's old one may not have timed out yet).
		for _, old := range next {
			if old.slaveID == hc.slaveID {
				m.log.Warn("broker: slave reconnected; closing its previous HA connection", "slave_id", hc.slaveID,
					"old", old.peer, "new", hc.peer)
				_ = old.c.Close()
			}
		}
		if hc.totals = m.mu.bySlave[hc.slaveID]; hc.totals == nil {
			hc.totals = &slaveTotals{}
			m.mu.bySlave[hc.slaveID] = hc.totals
		}
		next = append(next, hc)
	} else {
		delete(m.mu.conns, hc)
	}
	m.live.Store(&next)
}

// report records a slave's acknowledgement.
func (m *haMaster) report(hc *haConn, off int64) {
	hc.ack.Store(off)
	for {
		cur := m.ackMax.Load()
		if off <= cur || m.ackMax.CompareAndSwap(cur, off) {
			break
		}
	}
	m.waiters.advance(m.ackMax.Load())
}

// slaveOK reports whether a SYNC_MASTER should wait for a slave to reach
// end (Java isSlaveOK): a slave is connected and the slaves are less than
// the max gap behind.
func (m *haMaster) slaveOK(end int64) bool {
	return len(*m.live.Load()) > 0 && end-m.ackMax.Load() < m.b.cfg.ha.maxGap
}

func (m *haMaster) status(st *HAStatus) {
	st.Epoch = m.b.epoch.Epoch
	st.HAAddr = m.addr
	now := time.Now()
	for _, hc := range *m.live.Load() {
		ack := hc.ack.Load()
		lag := st.LogEnd - max(ack, 0)
		sent := hc.totals.sent.Load()
		st.Slaves = append(st.Slaves, SlaveStatus{
			BrokerID: hc.slaveID, Addr: hc.addr, AckOffset: ack, Lag: lag,
			InSync:    ack >= 0 && lag < m.b.cfg.ha.maxGap,
			BytesSent: sent, BytesPerSecond: hc.totals.flow.perSecond(now),
			NextOffset: hc.next.Load(), BufferBytes: hc.buffer.Load(), Since: hc.since,
		})
	}
	st.SyncWaiting = m.waiters.waiting.Load()
	st.SyncTimeouts = m.waiters.timeouts.Load()
	st.SlaveNotAvailable = m.waiters.notAvailable.Load()
}

// refusal is why a master refuses a slave's handshake ("" to accept it).
func (m *haMaster) refusal(f *protocol.HASlaveFrame) string {
	b := m.b
	id := f.Identity
	switch {
	case id.Cluster != b.cfg.clusterName || id.BrokerName != b.cfg.brokerName:
		return fmt.Sprintf("slave %s is broker %q of cluster %q; this master is broker %q of cluster %q: a slave must have its master's broker and cluster names",
			id.BrokerAddr, id.BrokerName, id.Cluster, b.cfg.brokerName, b.cfg.clusterName)
	case f.BrokerID <= 0:
		return fmt.Sprintf("broker id %d is not a slave's (a slave's id is above 0)", f.BrokerID)
	case id.LogID != "" && id.LogID != m.logID:
		return fmt.Sprintf("the slave holds the log of another master (log id %s; this master's is %s): it is not a copy of this master's log; start the slave on an empty data directory to copy this master",
			id.LogID, m.logID)
	}
	return ""
}

// serve runs one slave connection: the handshake, then the reader (the
// slave's reports) on this goroutine and the writer (the log) on another.
func (hc *haConn) serve(ctx context.Context) {
	m := hc.m
	defer func() {
		_ = hc.c.Close()
		m.setLive(hc, false)
	}()
	hk := m.b.cfg.ha.housekeeping
	br := bufio.NewReaderSize(hc.c, 4096)
	_ = hc.c.SetReadDeadline(time.Now().Add(hk))
	f, err := protocol.ReadHASlaveFrame(br, 64<<10)
	if err != nil {
		m.log.Warn("broker: HA connection closed before its handshake", "peer", hc.peer, "err", err)
		return
	}
	if f.State != protocol.HAStateHandshake {
		m.log.Warn("broker: HA connection did not start with a handshake", "peer", hc.peer, "state", f.State)
		return
	}
	hc.slaveID, hc.addr = f.BrokerID, f.Identity.BrokerAddr
	if hc.addr == "" {
		hc.addr = hc.peer
	}
	if reason := m.refusal(&f); reason != "" {
		m.log.Error("broker: refused a slave", "peer", hc.peer, "slave_id", f.BrokerID, "reason", reason)
		_ = hc.write(protocol.AppendHARefusal(nil, reason))
		return
	}
	epochs, err := m.b.store.Epochs()
	if err != nil {
		m.log.Error("broker: HA handshake", "peer", hc.peer, "err", err)
		return
	}
	hs := make([]protocol.HAEpoch, len(epochs))
	for i, e := range epochs {
		hs[i] = protocol.HAEpoch{Epoch: e.Epoch, StartOffset: e.StartOffset}
	}
	id := protocol.HAIdentity{Cluster: m.b.cfg.clusterName, BrokerName: m.b.cfg.brokerName, BrokerAddr: m.b.hostStr, LogID: m.logID}
	frame, err := protocol.AppendHAMasterHandshake(nil, m.b.store.LogEnd(), m.b.epoch.Epoch, id, hs)
	if err == nil {
		err = hc.write(frame)
	}
	if err != nil {
		m.log.Warn("broker: HA handshake", "peer", hc.peer, "err", err)
		return
	}
	m.wg.Add(1)
	go pprof.Do(ctx, pprof.Labels("broker", "ha-writer", "peer", hc.peer), func(ctx context.Context) {
		defer m.wg.Done()
		if err := hc.transfer(ctx, epochs); err != nil && ctx.Err() == nil {
			m.log.Warn("broker: HA transfer to a slave stopped", "slave", hc.addr, "slave_id", hc.slaveID, "err", err)
		}
		_ = hc.c.Close() // ends the reader too
	})
	defer close(hc.quit)
	reported := false
	for {
		_ = hc.c.SetReadDeadline(time.Now().Add(hk))
		f, err := protocol.ReadHASlaveFrame(br, 64<<10)
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				m.log.Warn("broker: HA connection of a slave ended", "slave", hc.addr, "slave_id", hc.slaveID, "err", err)
			}
			return
		}
		if f.State != protocol.HAStateTransfer {
			m.log.Warn("broker: slave sent an unexpected HA frame", "slave", hc.addr, "state", f.State)
			return
		}
		if !reported {
			reported = true
			hc.first <- f.MaxOffset
			m.log.Info("broker: slave connected", "slave", hc.addr, "slave_id", hc.slaveID, "from", f.MaxOffset,
				"master_end", m.b.store.LogEnd())
		}
		m.report(hc, f.MaxOffset)
	}
}

// write writes one frame with the write deadline of the housekeeping
// interval (a slave that stops reading is dropped after it).
func (hc *haConn) write(frame []byte) error {
	hc.wmu.Lock()
	defer hc.wmu.Unlock()
	_ = hc.c.SetWriteDeadline(time.Now().Add(hc.m.b.cfg.ha.housekeeping))
	_, err := hc.c.Write(frame)
	return err
}

// transfer streams the log from the slave's first report on, one epoch at
// a time (a frame never spans two epochs), with a heartbeat on an idle
// connection.
func (hc *haConn) transfer(ctx context.Context, epochs []store.Epoch) error {
	m, st := hc.m, hc.m.b.store
	var next int64
	select {
	case next = <-hc.first:
	case <-hc.quit:
		return nil
	case <-ctx.Done():
		return nil
	}
	if end := st.LogEnd(); next > end {
		reason := fmt.Sprintf("the slave's log ends at %d, beyond this master's (%d): it holds records this master does not have", next, end)
		m.log.Error("broker: refused a slave", "slave", hc.addr, "reason", reason)
		_ = hc.write(protocol.AppendHARefusal(nil, reason))
		return errDiverged
	}
	if start, end, inside, err := st.RecordCovering(next); err != nil {
		return err
	} else if inside {
		reason := fmt.Sprintf("the slave's log ends at %d, inside this master's record [%d, %d): the logs diverged", next, start, end)
		m.log.Error("broker: refused a slave", "slave", hc.addr, "reason", reason)
		_ = hc.write(protocol.AppendHARefusal(nil, reason))
		return errDiverged
	}
	m.setLive(hc, true)
	hc.next.Store(next)
	buf := make([]byte, 0, m.b.cfg.ha.batchBytes+64<<10)
	hc.buffer.Store(int64(cap(buf)))
	hb := time.NewTicker(m.b.cfg.ha.heartbeat)
	defer hb.Stop()
	lastWrite := time.Now()
	for {
		end := st.LogEnd()
		if next < end {
			// The epoch next is in, and where it ends.
			ep, limit := store.Epoch{}, end
			for i, e := range epochs {
				if e.StartOffset <= next {
					ep, limit = e, end
					if i+1 < len(epochs) && epochs[i+1].StartOffset > next {
						limit = min(end, epochs[i+1].StartOffset)
					}
				}
			}
			buf = buf[:protocol.HATransferHeaderLen]
			first := int64(-1)
			var encErr error
			n, err := st.ReadLog(next, m.b.cfg.ha.batchBytes, func(e *store.LogEntry) bool {
				if e.Phys >= limit {
					return false
				}
				if first < 0 {
					first = e.Phys
				}
				buf, encErr = protocol.AppendHALogEntryStart(buf, e.Record, e.TagsCode, e.KeyCount())
				e.ForEachKey(func(k []byte) {
					if encErr == nil {
						buf, encErr = protocol.AppendHALogKey(buf, k)
					}
				})
				return encErr == nil
			})
			if err = errors.Join(err, encErr); err != nil {
				return err
			}
			hc.buffer.Store(int64(cap(buf))) // grows only for a record above the batch size
			if first < 0 {
				// Nothing left before the epoch's end (or the log's): a
				// hole of deleted records.
				next = limit
				hc.next.Store(next)
				continue
			}
			body := len(buf) - protocol.HATransferHeaderLen
			protocol.AppendHATransferHeader(buf[:0], body, first, ep.Epoch, ep.StartOffset, end)
			if err := hc.write(buf); err != nil {
				return err
			}
			lastWrite = time.Now()
			hc.totals.sent.Add(int64(body))
			hc.totals.flow.add(lastWrite, int64(body))
			next = n
			hc.next.Store(next)
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-hc.quit:
			return nil
		case <-hc.wake:
		case <-hb.C:
			if time.Since(lastWrite) >= m.b.cfg.ha.heartbeat/2 {
				ep := epochs[len(epochs)-1]
				if err := hc.write(protocol.AppendHATransferHeader(buf[:0], 0, next, ep.Epoch, ep.StartOffset, end)); err != nil {
					return err
				}
				lastWrite = time.Now()
			}
		}
	}
}

// ---- SYNC_MASTER waits ----

// replicaWaiters holds the sends a SYNC_MASTER answers once a slave has
// them (Java GroupTransferService): ordered by the log end they need; the
// slaves' reports release them, a ticker times them out.
type replicaWaiters struct {
	m    *haMaster
	wake chan struct{} // capacity 1: a waiter was added

	waiting, timeouts, notAvailable atomic.Int64

	mu struct {
		sync.Mutex
		list   []replicaWait // ascending end (mostly appended)
		closed bool
	}
}

// replicaWait is one send waiting for a slave: answered on rc with resp
// (its code set to the outcome, unless keepCode) or, for a blocking caller,
// through ch.
type replicaWait struct {
	end      int64
	deadline time.Time
	rc       *remoting.RequestCtx
	resp     *protocol.Command
	keepCode bool
	ch       chan int32
}

func newReplicaWaiters(m *haMaster) *replicaWaiters {
	return &replicaWaiters{m: m, wake: make(chan struct{}, 1)}
}

func (rw *replicaWait) complete(code int32) {
	if rw.ch != nil {
		rw.ch <- code
		return
	}
	if !rw.keepCode {
		rw.resp.Code = code
	}
	_ = rw.rc.Respond(rw.resp) // a failure closed the connection, which reports it
}

// add registers w, or completes it at once: SUCCESS when a slave already
// has end, SLAVE_NOT_AVAILABLE when no slave is in sync (Java isSlaveOK).
// It never blocks (it runs on the store's committer).
func (w *replicaWaiters) add(rw replicaWait) {
	m := w.m
	if m.ackMax.Load() >= rw.end {
		rw.complete(protocol.ResSuccess)
		return
	}
	if !m.slaveOK(rw.end) {
		w.notAvailable.Add(1)
		rw.complete(protocol.ResSlaveNotAvailable)
		return
	}
	rw.deadline = time.Now().Add(m.b.cfg.ha.slaveTimeout)
	w.mu.Lock()
	if w.mu.closed {
		w.mu.Unlock()
		w.timeouts.Add(1)
		rw.complete(protocol.ResFlushSlaveTimeout)
		return
	}
	i := len(w.mu.list)
	for i > 0 && w.mu.list[i-1].end > rw.end {
		i--
	}
	w.mu.list = slices.Insert(w.mu.list, i, rw)
	first := len(w.mu.list) == 1
	w.mu.Unlock()
	w.waiting.Add(1)
	// The ack may have arrived between the check above and the insert.
	w.advance(m.ackMax.Load())
	if first {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// advance releases the waiters a slave's log end ack covers.
func (w *replicaWaiters) advance(ack int64) {
	w.mu.Lock()
	n := 0
	for n < len(w.mu.list) && w.mu.list[n].end <= ack {
		n++
	}
	if n == 0 {
		w.mu.Unlock()
		return
	}
	done := slices.Clone(w.mu.list[:n])
	w.mu.list = slices.Delete(w.mu.list, 0, n)
	w.mu.Unlock()
	w.waiting.Add(-int64(n))
	for i := range done {
		done[i].complete(protocol.ResSuccess)
	}
}

// run times out waiters until ctx ends.
func (w *replicaWaiters) run(ctx context.Context) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-w.wake:
		}
		now := time.Now()
		w.mu.Lock()
		var expired []replicaWait
		w.mu.list = slices.DeleteFunc(w.mu.list, func(rw replicaWait) bool {
			if rw.deadline.After(now) {
				return false
			}
			expired = append(expired, rw)
			return true
		})
		w.mu.Unlock()
		if len(expired) == 0 {
			continue
		}
		w.waiting.Add(-int64(len(expired)))
		w.timeouts.Add(int64(len(expired)))
		w.m.log.Warn("broker: no slave acknowledged in time; answered FLUSH_SLAVE_TIMEOUT",
			"sends", len(expired), "timeout", w.m.b.cfg.ha.slaveTimeout, "need", expired[0].end, "slave_ack", w.m.ackMax.Load())
		for i := range expired {
			expired[i].complete(protocol.ResFlushSlaveTimeout)
		}
	}
}

// close answers every waiter (shutdown): SUCCESS if a slave has its
// message, else FLUSH_SLAVE_TIMEOUT; later adds are answered at once.
func (w *replicaWaiters) close() {
	w.mu.Lock()
	w.mu.closed = true
	list := w.mu.list
	w.mu.list = nil
	w.mu.Unlock()
	w.waiting.Add(-int64(len(list)))
	ack := w.m.ackMax.Load()
	for i := range list {
		if list[i].end <= ack {
			list[i].complete(protocol.ResSuccess)
		} else {
			w.timeouts.Add(1)
			list[i].complete(protocol.ResFlushSlaveTimeout)
		}
	}
}

// syncMasterWait reports whether a send of properties props stored by
// this broker must wait for a slave: a SYNC_MASTER with HA running, and
// the message not sent with WAIT=false (Java isWaitStoreMsgOK).
func (b *Broker) syncMasterWait(props string) bool {
	if b.cfg.ha.role != RoleSyncMaster || b.master == nil {
		return false
	}
	if v, ok := protocol.PropertyValue(props, protocol.PropWaitStoreMsgOK); ok && v == "false" {
		return false
	}
	return true
}

// awaitReplica answers resp on rc once a slave has the log up to end (its
// code set to SUCCESS, FLUSH_SLAVE_TIMEOUT or SLAVE_NOT_AVAILABLE, or kept
// with keepCode). It does not block.
func (b *Broker) awaitReplica(end int64, rc *remoting.RequestCtx, resp *protocol.Command, keepCode bool) {
	b.master.waiters.add(replicaWait{end: end, rc: rc, resp: resp, keepCode: keepCode})
}

// awaitReplicaBlocking waits until a slave has the log up to end and
// returns the send status code: SUCCESS, FLUSH_SLAVE_TIMEOUT or
// SLAVE_NOT_AVAILABLE. ctx ending answers FLUSH_SLAVE_TIMEOUT at once (the
// waiter is released by its own timeout).
func (b *Broker) awaitReplicaBlocking(ctx context.Context, end int64) int32 {
	ch := make(chan int32, 1)
	b.master.waiters.add(replicaWait{end: end, ch: ch})
	select {
	case code := <-ch:
		return code
	case <-ctx.Done():
		return protocol.ResFlushSlaveTimeout
	}
}

// haDescribe is a one-line summary of the HA settings, for the start log.
func (b *Broker) haDescribe() string {
	s := b.cfg.ha.role.String() + " id=" + strconv.FormatInt(b.cfg.ha.brokerID, 10)
	if m := b.master; m != nil {
		s += " ha=" + m.addr
	}
	if b.cfg.ha.masterHA != "" {
		s += " master_ha=" + b.cfg.ha.masterHA
	}
	return s
}
