package broker

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime/pprof"
	"strings"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/transport/acl"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// Timeouts of name server calls.
const (
	nsDialTimeout   = 3 * time.Second
	nsInvokeTimeout = 5 * time.Second
	nsMaxBackoff    = 10 * time.Second
)

// registrar keeps one long-lived connection to one name server and
// registers the broker's full topic table over it: at start, every
// register interval, right after a topic is created or deleted (signal),
// and as soon as a lost connection is re-established. A Java name server
// forgets a broker whose registration connection closes, so the
// connection is kept open rather than dialled per call.
type registrar struct {
	b       *Broker
	addr    string
	trigger chan struct{} // capacity 1: coalesced "topics changed"
	// retrySoon is set before run starts when the first registration
	// failed, so run retries with backoff rather than after an interval.
	retrySoon bool

	mu struct {
		sync.Mutex
		conn *remoting.Conn
	}
	// gen numbers the registrations: started counts those that took their
	// snapshot of the topic table, ok is the number of the last one the
	// name server accepted, and changed is closed (and replaced) whenever a
	// registration ends, for awaitRegistered.
	gen struct {
		sync.Mutex
		started, ok uint64
		changed     chan struct{}
	}
}

func newRegistrar(b *Broker, addr string) *registrar {
	r := &registrar{b: b, addr: addr, trigger: make(chan struct{}, 1)}
	r.gen.changed = make(chan struct{})
	return r
}

// startGen numbers a registration about to take its snapshot.
func (r *registrar) startGen() uint64 {
	r.gen.Lock()
	defer r.gen.Unlock()
	r.gen.started++
	return r.gen.started
}

// endGen records the end of registration g (accepted or not) and wakes
// the waiters.
func (r *registrar) endGen(g uint64, accepted bool) {
	r.gen.Lock()
	defer r.gen.Unlock()
	if accepted && g > r.gen.ok {
		r.gen.ok = g
	}
	close(r.gen.changed)
	r.gen.changed = make(chan struct{})
}

// askNext asks for a registration and returns the number it will have at
// the latest: the first one to take its snapshot after the call, which
// therefore holds every topic published before it.
func (r *registrar) askNext() uint64 {
	r.gen.Lock()
	want := r.gen.started + 1
	r.gen.Unlock()
	r.signal()
	return want
}

// awaitGen waits until the name server has accepted registration want or
// a later one, or ctx ends.
func (r *registrar) awaitGen(ctx context.Context, want uint64) error {
	for {
		r.gen.Lock()
		ok, changed := r.gen.ok, r.gen.changed
		r.gen.Unlock()
		if ok >= want {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-r.b.regCtx.Done(): // registrations stopped (shutdown)
			return r.b.regCtx.Err()
		case <-changed:
		}
	}
}

// registerNowTimeout bounds how long awaitRegistered holds the request
// that created a topic, below the clients' 3 s request timeout.
const registerNowTimeout = 2 * time.Second

// awaitRegistered registers the topic table with every name server and
// waits, at most registerNowTimeout, until each has accepted it. A Java
// broker registers a topic it creates for a heartbeat or a send-back
// (createTopicInSendMessageBackMethod) before it answers, so the client's
// next route lookup finds it; a name server that does not answer in time
// gets the topic with the registration still under way.
func (b *Broker) awaitRegistered(ctx context.Context) {
	if len(b.regs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, registerNowTimeout)
	defer cancel()
	want := make([]uint64, len(b.regs))
	for i, r := range b.regs {
		want[i] = r.askNext()
	}
	for i, r := range b.regs {
		if err := r.awaitGen(ctx, want[i]); err != nil {
			b.log.Debug("broker: new topic not registered in time; registration goes on", "namesrv", r.addr, "err", err)
			return
		}
	}
}

// signal asks for a registration soon; it never blocks.
func (r *registrar) signal() {
	select {
	case r.trigger <- struct{}{}:
	default:
	}
}

// triggerRegister tells every name server about changed topics.
func (b *Broker) triggerRegister() {
	for _, r := range b.regs {
		r.signal()
	}
}

// connDone returns the current connection's Done channel (nil when there
// is none, which blocks forever in a select).
func (r *registrar) connDone() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mu.conn == nil {
		return nil
	}
	return r.mu.conn.Done()
}

// conn returns the open connection, dialling a new one if needed.
func (r *registrar) conn(ctx context.Context) (*remoting.Conn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c := r.mu.conn; c != nil {
		select {
		case <-c.Done():
			_ = c.Close() // already closed; joins its goroutines
			r.mu.conn = nil
		default:
			return c, nil
		}
	}
	dctx, cancel := context.WithTimeout(ctx, nsDialTimeout)
	defer cancel()
	opts := []remoting.Option{remoting.WithLogger(r.b.log)}
	if cfg := r.b.cfg.nsTLS; cfg != nil {
		opts = append(opts, remoting.WithTLSConfig(cfg))
	}
	c, err := remoting.Dial(dctx, r.addr, opts...)
	if err != nil {
		return nil, err
	}
	r.mu.conn = c
	return c, nil
}

// closeConn closes the connection, if any.
func (r *registrar) closeConn() {
	r.mu.Lock()
	c := r.mu.conn
	r.mu.conn = nil
	r.mu.Unlock()
	if c != nil {
		_ = c.Close() // nothing to report: we are done with it
	}
}

// registerOnce sends one full REGISTER_BROKER and checks the answer.
func (r *registrar) registerOnce(ctx context.Context) error {
	c, err := r.conn(ctx)
	if err != nil {
		return fmt.Errorf("broker: register with %s: %w", r.addr, err)
	}
	g := r.startGen()
	accepted := false
	defer func() { r.endGen(g, accepted) }()
	req, err := r.b.registerRequest()
	if err != nil {
		return err
	}
	r.b.signForNameServer(req)
	ictx, cancel := context.WithTimeout(ctx, nsInvokeTimeout)
	defer cancel()
	resp, err := c.Invoke(ictx, req)
	if err != nil {
		return fmt.Errorf("broker: register with %s: %w", r.addr, err)
	}
	if err := protocol.ResponseError(resp); err != nil {
		var pe *protocol.Error
		if errors.As(err, &pe) && strings.HasPrefix(pe.Remark, conflictRemark) {
			r.b.log.Error("broker: the name server refused the registration", "namesrv", r.addr, "reason", pe.Remark)
			return fmt.Errorf("%w: %s: %w", errRegistrationConflict, r.addr, err)
		}
		return fmt.Errorf("broker: register with %s: %w", r.addr, err)
	}
	accepted = true
	if s := r.b.slave; s != nil {
		var rh protocol.RegisterBrokerResponseHeader
		if err := rh.Decode(resp); err == nil {
			s.learn(rh.MasterAddr, rh.HAServerAddr)
		}
	}
	return nil
}

// conflictRemark starts the remark of a name server's refusal of a broker
// whose registration contradicts another's (a second master of one broker
// name, a broker name in two clusters): runnel's name server says so.
const conflictRemark = "[BROKER_CONFLICT]"

// errRegistrationConflict is wrapped by the error of a registration a name
// server refused as contradicting another broker's; Start fails with it.
var errRegistrationConflict = errors.New("broker: registration conflicts with another broker's")

// defaultConflictGrace is how long Start keeps registering while a name
// server refuses the registration as a conflict: a master that was killed
// and restarts at another address may register before the name server saw
// its old connection close (which evicts the old address).
const defaultConflictGrace = 5 * time.Second

// registerFirst is Start's first registration: registerOnce, repeated for
// up to conflictGrace while the name server reports a conflict.
func (r *registrar) registerFirst(ctx context.Context) error {
	deadline := time.Now().Add(r.b.cfg.conflictGrace)
	for {
		err := r.registerOnce(ctx)
		if !errors.Is(err, errRegistrationConflict) || time.Now().After(deadline) {
			return err
		}
		t := time.NewTimer(200 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// run re-registers until ctx ends: every interval, on signal, and after a
// lost connection (with a capped exponential backoff after failures).
func (r *registrar) run(ctx context.Context) {
	interval := r.b.cfg.registerInterval
	var backoff time.Duration
	first := interval
	if r.retrySoon {
		backoff = 100 * time.Millisecond
		first = backoff
	}
	t := time.NewTimer(first)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.trigger:
		case <-r.connDone():
		}
		if err := r.registerOnce(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			backoff = min(max(2*backoff, 100*time.Millisecond), nsMaxBackoff)
			r.b.log.Warn("broker: registration failed; will retry", "namesrv", r.addr, "retry_in", backoff, "err", err)
			r.closeConn()
			t.Reset(backoff)
			continue
		}
		backoff = 0
		t.Reset(interval)
	}
}

// registerRequest builds a REGISTER_BROKER request with the full topic
// table (at least the system topics, so never the single-topic first
// registration a Java name server rejects).
func (b *Broker) registerRequest() (*protocol.Command, error) {
	table, version := b.topics.snapshot()
	body := protocol.RegisterBrokerBody{
		FilterServerList: []string{},
		TopicConfigSerializeWrapper: protocol.TopicConfigSerializeWrapper{
			DataVersion:      version,
			TopicConfigTable: table,
		},
	}
	enc, err := body.Encode()
	if err != nil {
		return nil, fmt.Errorf("broker: encode registration: %w", err)
	}
	req := protocol.NewRequest(protocol.ReqRegisterBroker)
	h := protocol.RegisterBrokerRequestHeader{
		BrokerName:   b.cfg.brokerName,
		BrokerAddr:   b.hostStr,
		ClusterName:  b.cfg.clusterName,
		HAServerAddr: b.haAddr(),
		BrokerID:     b.brokerID(),
		Compressed:   protocol.Some(false),
		BodyCRC32:    protocol.Some(protocol.BodyCRC(enc)),
	}
	h.Encode(req)
	req.Body = enc
	return req, nil
}

// haAddr is the HA address registered with the name servers: a master's
// HA listener, else the advertised host with the listen port + 1 (what a
// Java broker registers).
func (b *Broker) haAddr() string {
	if m := b.master; m != nil {
		return m.addr
	}
	return netip.AddrPortFrom(b.host.Addr(), b.host.Port()+1).String()
}

// stopRegistrars stops the registration loops and waits for them.
func (b *Broker) stopRegistrars() {
	b.regCancel()
	b.regWG.Wait()
}

// closeRegistrarConns closes every name server connection.
func (b *Broker) closeRegistrarConns() {
	for _, r := range b.regs {
		r.closeConn()
	}
}

// unregisterAll sends UNREGISTER_BROKER to every name server and closes
// the connections. Failures are logged, not returned: a name server that
// does not hear it drops the broker when the connection closes or the
// registration expires, so shutdown must not fail for it.
func (b *Broker) unregisterAll(ctx context.Context) {
	for _, r := range b.regs {
		if err := r.unregister(ctx); err != nil {
			b.log.Warn("broker: unregister failed; the name server will expire the broker", "namesrv", r.addr, "err", err)
		}
		r.closeConn()
	}
}

func (r *registrar) unregister(ctx context.Context) error {
	c, err := r.conn(ctx)
	if err != nil {
		return err
	}
	req := protocol.NewRequest(protocol.ReqUnregisterBroker)
	h := protocol.UnRegisterBrokerRequestHeader{
		BrokerName: r.b.cfg.brokerName, BrokerAddr: r.b.hostStr, ClusterName: r.b.cfg.clusterName, BrokerID: r.b.brokerID(),
	}
	h.Encode(req)
	r.b.signForNameServer(req)
	ictx, cancel := context.WithTimeout(ctx, nsInvokeTimeout)
	defer cancel()
	resp, err := c.Invoke(ictx, req)
	if err != nil {
		return err
	}
	return protocol.ResponseError(resp)
}

// signForNameServer signs req with the name server credentials, if any.
// Call it last: the headers, body and body CRC must be final.
func (b *Broker) signForNameServer(req *protocol.Command) {
	if cr := b.cfg.nsCreds; cr != nil {
		acl.Sign(req, *cr)
	}
}

// goRegistrar runs a registrar loop on a goroutine joined by stopRegistrars.
func (b *Broker) goRegistrar(r *registrar) {
	b.regWG.Add(1)
	go pprof.Do(b.regCtx, pprof.Labels("broker", "register", "namesrv", r.addr), func(ctx context.Context) {
		defer b.regWG.Done()
		r.run(ctx)
	})
}
