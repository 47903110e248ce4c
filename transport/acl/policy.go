package acl

import (
	"context"
	"crypto/hmac"
	"crypto/sha1"
	"errors"
	"fmt"
	"hash"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// ErrNoFile is returned by Reload on a Policy not built by LoadPolicy.
var ErrNoFile = errors.New("acl: policy was not loaded from a file")

// Policy decides, for every request a server receives, whether it is
// signed by a known account (protocol §8) and whether that account may send
// it. Build it with LoadPolicy (from a file, reloadable) or NewPolicy (from
// a Config), and install it on a remoting.Server with ServerOption.
//
// A Policy is safe for concurrent use. Check never blocks; Reload and
// Update swap the whole configuration atomically, so a request is judged
// entirely by the old or entirely by the new one.
type Policy struct {
	log  *slog.Logger
	path string

	cur     atomic.Pointer[compiled]
	reload  sync.Mutex // serialises Reload and Update, so the last one read wins
	scratch sync.Pool  // *scratch

	allowed atomic.Int64
	denied  atomic.Int64
}

// Option configures a Policy.
type Option interface{ apply(*Policy) }

type optionFunc func(*Policy)

func (f optionFunc) apply(p *Policy) { f(p) }

// WithLogger sets the logger; nil (the default) discards. Denials are
// logged at Debug (they are also counted in Stats), reloads at Info.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(p *Policy) { p.log = l })
}

// compiled is one validated configuration in the form Check uses.
type compiled struct {
	accounts      map[string]*account
	allow         []netip.Prefix
	unsignedToken bool
}

type account struct {
	accessKey string
	secret    []byte
	admin     bool
	defTopic  Perm
	defGroup  Perm
	topics    map[string]Perm
	groups    map[string]Perm
	macs      sync.Pool // hash.Hash keyed with secret
}

// NewPolicy returns a Policy enforcing cfg, which is validated first.
// Reload is not available on it; use Update to change it.
func NewPolicy(cfg *Config, opts ...Option) (*Policy, error) {
	p := newPolicy(opts)
	if err := p.Update(cfg); err != nil {
		return nil, err
	}
	return p, nil
}

// LoadPolicy returns a Policy enforcing the ACL file at path; Reload reads
// the file again.
func LoadPolicy(path string, opts ...Option) (*Policy, error) {
	p := newPolicy(opts)
	p.path = path
	if err := p.Reload(); err != nil {
		return nil, err
	}
	return p, nil
}

func newPolicy(opts []Option) *Policy {
	p := &Policy{}
	for _, o := range opts {
		o.apply(p)
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	p.scratch.New = func() any { return &scratch{idx: make([]int, 0, 32), content: make([]byte, 0, 1024)} }
	return p
}

// Reload reads and validates the policy's file again and, when it is
// valid, enforces it from the next request on. When it is not, the
// configuration in force stays and the error says why. Meant for SIGHUP;
// nothing on the wire can trigger it.
func (p *Policy) Reload() error {
	if p.path == "" {
		return ErrNoFile
	}
	p.reload.Lock()
	defer p.reload.Unlock()
	cfg, err := LoadConfig(p.path)
	if err != nil {
		return err
	}
	if err := p.updateLocked(cfg); err != nil {
		return err
	}
	p.log.Info("acl: policy loaded", "file", p.path, "accounts", len(cfg.Accounts), "allowCIDRs", len(cfg.AllowCIDRs))
	return nil
}

// Update validates cfg and enforces it from the next request on; on error
// the configuration in force stays.
func (p *Policy) Update(cfg *Config) error {
	p.reload.Lock()
	defer p.reload.Unlock()
	return p.updateLocked(cfg)
}

func (p *Policy) updateLocked(cfg *Config) error {
	if cfg == nil {
		return fmt.Errorf("%w: nil configuration", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	c, err := compile(cfg)
	if err != nil {
		return err
	}
	p.cur.Store(c)
	return nil
}

func compile(cfg *Config) (*compiled, error) {
	c := &compiled{accounts: make(map[string]*account, len(cfg.Accounts)), unsignedToken: cfg.AcceptUnsignedSecurityToken}
	for _, s := range cfg.AllowCIDRs {
		pfx, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("%w: allowCIDRs: %w", ErrInvalidConfig, err)
		}
		c.allow = append(c.allow, pfx)
	}
	for i := range cfg.Accounts {
		a := &cfg.Accounts[i]
		ac := &account{accessKey: a.AccessKey, secret: []byte(a.SecretKey), admin: a.Admin,
			topics: make(map[string]Perm, len(a.TopicPerms)), groups: make(map[string]Perm, len(a.GroupPerms))}
		var err error
		if ac.defTopic, err = permOrDeny(a.DefaultTopicPerm); err != nil {
			return nil, fmt.Errorf("%w: accounts[%d].defaultTopicPerm: %w", ErrInvalidConfig, i, err)
		}
		if ac.defGroup, err = permOrDeny(a.DefaultGroupPerm); err != nil {
			return nil, fmt.Errorf("%w: accounts[%d].defaultGroupPerm: %w", ErrInvalidConfig, i, err)
		}
		for name, s := range a.TopicPerms {
			if ac.topics[name], err = ParsePerm(s); err != nil {
				return nil, fmt.Errorf("%w: accounts[%d].topicPerms[%s]: %w", ErrInvalidConfig, i, name, err)
			}
		}
		for name, s := range a.GroupPerms {
			if ac.groups[name], err = ParsePerm(s); err != nil {
				return nil, fmt.Errorf("%w: accounts[%d].groupPerms[%s]: %w", ErrInvalidConfig, i, name, err)
			}
		}
		secret := ac.secret
		ac.macs.New = func() any { return hmac.New(sha1.New, secret) }
		c.accounts[a.AccessKey] = ac
	}
	return c, nil
}

func permOrDeny(s string) (Perm, error) {
	if s == "" {
		return PermDeny, nil
	}
	return ParsePerm(s)
}

// Stats counts the requests a Policy judged since it was built.
type Stats struct {
	Allowed int64
	Denied  int64
}

// Stats returns the counters.
func (p *Policy) Stats() Stats {
	return Stats{Allowed: p.allowed.Load(), Denied: p.denied.Load()}
}

// ServerOption returns the option that makes a remoting.Server check every
// request with p before anything else handles it (remoting.WithInterceptor):
// a denied request is answered NO_PERMISSION (16) and reaches no processor.
func (p *Policy) ServerOption() remoting.ServerOption {
	return remoting.WithInterceptor(p.Intercept)
}

// Intercept is p as a remoting.Interceptor: it answers a denied request
// with NO_PERMISSION and lets an allowed one through.
func (p *Policy) Intercept(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, bool) {
	req := rc.Request()
	if err := p.Check(req, rc.RemoteAddr()); err != nil {
		var pe *protocol.Error
		if errors.As(err, &pe) {
			return protocol.NewResponse(req, pe.Code, pe.Remark), true
		}
		return protocol.NewResponse(req, protocol.ResNoPermission, err.Error()), true
	}
	return nil, false
}

// Check judges one request from remote: nil when it may proceed, else a
// *protocol.Error with code NO_PERMISSION (16) and a remark starting with
// "acl: " that says why. In order: the global IP allow-list, a known
// AccessKey, the signature (constant-time comparison), then the
// requirement of the request code (see Requirement). It never blocks and,
// once warm, allocates only to describe a denial (and to decode
// HEART_BEAT and LOCK_BATCH_MQ bodies).
func (p *Policy) Check(req *protocol.Command, remote net.Addr) error {
	c := p.cur.Load()
	reason := p.check(c, req, remote)
	if reason == "" {
		p.allowed.Add(1)
		return nil
	}
	p.denied.Add(1)
	p.log.Debug("acl: request denied", "code", req.Code, "remote", addrString(remote), "reason", reason)
	return &protocol.Error{Code: protocol.ResNoPermission, Remark: "acl: " + reason}
}

// check returns "" when req is allowed, else the reason.
func (p *Policy) check(c *compiled, req *protocol.Command, remote net.Addr) string {
	if len(c.allow) > 0 && !allowed(c.allow, remote) {
		return "address " + addrString(remote) + " is not in the allow-list"
	}
	ak, ok := req.Ext(KeyAccessKey)
	if !ok || ak == "" {
		return "no AccessKey: this server requires signed requests (ACL credentials)"
	}
	a := c.accounts[ak]
	if a == nil {
		return "unknown AccessKey " + quote(ak)
	}
	if !p.verify(c, a, req) {
		return "signature mismatch for AccessKey " + quote(ak) +
			": wrong secret key, or headers or body changed after signing"
	}
	r, ok := ruleFor(req.Code)
	if !ok {
		return "request code " + strconv.Itoa(int(req.Code)) + " is not allowed when ACL is enabled"
	}
	return a.authorize(r, req)
}

// verify checks req's Signature against a's secret.
func (p *Policy) verify(c *compiled, a *account, req *protocol.Command) bool {
	sig, _ := req.Ext(KeySignature)
	if len(sig) != signatureLen {
		return false
	}
	s := p.scratch.Get().(*scratch)
	mac := a.macs.Get().(hash.Hash)
	ok := hmac.Equal(s.signature(mac, req, false), []byte(sig))
	if !ok && c.unsignedToken {
		if _, has := req.Ext(KeySecurityToken); has {
			ok = hmac.Equal(s.signature(mac, req, true), []byte(sig))
		}
	}
	a.macs.Put(mac)
	if cap(s.content) <= 64<<10 { // do not pin the buffer of a huge header
		p.scratch.Put(s)
	}
	return ok
}

// authorize checks the requirement r of req against the account.
func (a *account) authorize(r rule, req *protocol.Command) string {
	if a.admin {
		return "" // admins may do everything, on every topic and group
	}
	switch r.kind {
	case kindAuthenticated:
		return ""
	case kindAdmin:
		return "request code " + strconv.Itoa(int(req.Code)) + " needs an admin account; " + quote(a.accessKey) + " is not one"
	case kindPubTopic, kindPubTopicIfSet:
		t, ok := firstExt(req, r.topicKeys)
		if !ok && r.kind == kindPubTopicIfSet {
			return ""
		}
		return a.needTopic(req, t, ok, PermPub)
	case kindSubTopic:
		t, ok := firstExt(req, r.topicKeys)
		return a.needTopic(req, t, ok, PermSub)
	case kindRouteTopic:
		t, ok := firstExt(req, r.topicKeys)
		return a.needTopic(req, t, ok, 0)
	case kindSubTopicGroup:
		t, ok := firstExt(req, r.topicKeys)
		if why := a.needTopic(req, t, ok, PermSub); why != "" {
			return why
		}
		g, ok := firstExt(req, r.groupKeys)
		return a.needGroup(req, g, ok)
	case kindSubGroup, kindSubGroupIfSet:
		g, ok := firstExt(req, r.groupKeys)
		if !ok && r.kind == kindSubGroupIfSet {
			return ""
		}
		return a.needGroup(req, g, ok)
	case kindHeartbeatBody:
		return a.authorizeHeartbeat(req)
	case kindLockBody:
		return a.authorizeLock(req)
	case kindBatchAckBody:
		return a.authorizeBatchAck(req)
	case kindAssignmentBody:
		var qa protocol.QueryAssignmentRequestBody
		if err := qa.Decode(req.Body); err != nil {
			return "cannot read the assignment body to authorise it: " + err.Error()
		}
		if why := a.needTopic(req, qa.Topic, true, PermSub); why != "" {
			return why
		}
		return a.needGroup(req, qa.ConsumerGroup, true)
	}
	return "request code " + strconv.Itoa(int(req.Code)) + " has no rule"
}

// needTopic checks need (PermPub or PermSub; 0 = either) on topic t. A
// retry topic %RETRY%<group> needs SUB on the group.
func (a *account) needTopic(req *protocol.Command, t string, named bool, need Perm) string {
	if !named || t == "" {
		return "request code " + strconv.Itoa(int(req.Code)) + " names no topic"
	}
	if g, ok := strings.CutPrefix(t, retryPrefix); ok {
		return a.needGroup(req, g, true)
	}
	have, ok := a.topics[t]
	if !ok {
		have = a.defTopic
	}
	if need == 0 && have != PermDeny || have.Allows(need) {
		return ""
	}
	want := need.String()
	if need == 0 {
		want = "PUB or SUB"
	}
	return quote(a.accessKey) + " lacks " + want + " on topic " + quote(t)
}

// needGroup checks SUB on consumer group g.
func (a *account) needGroup(req *protocol.Command, g string, named bool) string {
	if !named || g == "" {
		return "request code " + strconv.Itoa(int(req.Code)) + " names no consumer group"
	}
	have, ok := a.groups[g]
	if !ok {
		have = a.defGroup
	}
	if have.Allows(PermSub) {
		return ""
	}
	return quote(a.accessKey) + " lacks SUB on group " + quote(g)
}

// authorizeHeartbeat needs SUB on every consumer group of a HEART_BEAT body
// and on every topic they subscribe to. Producer groups are not resources
// (as in RocketMQ): a producer-only heartbeat needs an account only.
func (a *account) authorizeHeartbeat(req *protocol.Command) string {
	var hb protocol.HeartbeatData
	if err := hb.Decode(req.Body); err != nil {
		return "cannot read the heartbeat body to authorise it: " + err.Error()
	}
	for _, cd := range hb.ConsumerDataSet {
		if why := a.needGroup(req, cd.GroupName, true); why != "" {
			return why
		}
		for _, sd := range cd.SubscriptionDataSet {
			if why := a.needTopic(req, sd.Topic, true, PermSub); why != "" {
				return why
			}
		}
	}
	return ""
}

// authorizeLock needs SUB on the group of a LOCK_BATCH_MQ or
// UNLOCK_BATCH_MQ body and on the topic of every queue in it.
func (a *account) authorizeLock(req *protocol.Command) string {
	var lb protocol.LockBatchRequestBody
	if err := lb.Decode(req.Body); err != nil {
		return "cannot read the lock body to authorise it: " + err.Error()
	}
	if why := a.needGroup(req, lb.ConsumerGroup, true); why != "" {
		return why
	}
	for _, mq := range lb.MQSet {
		if why := a.needTopic(req, mq.Topic, true, PermSub); why != "" {
			return why
		}
	}
	return ""
}

// authorizeBatchAck needs SUB on the topic and the group of every ack of
// a BATCH_ACK_MESSAGE body.
func (a *account) authorizeBatchAck(req *protocol.Command) string {
	var body protocol.BatchAckMessageRequestBody
	if err := body.Decode(req.Body); err != nil {
		return "cannot read the batch ack body to authorise it: " + err.Error()
	}
	for _, ack := range body.Acks {
		if why := a.needTopic(req, ack.Topic, true, PermSub); why != "" {
			return why
		}
		if why := a.needGroup(req, ack.ConsumerGroup, true); why != "" {
			return why
		}
	}
	return ""
}

// firstExt returns the value of the first of keys present.
func firstExt(req *protocol.Command, keys []string) (string, bool) {
	for _, k := range keys {
		if v, ok := req.Ext(k); ok {
			return v, true
		}
	}
	return "", false
}

// allowed reports whether remote lies in one of the prefixes.
func allowed(allow []netip.Prefix, remote net.Addr) bool {
	ta, ok := remote.(*net.TCPAddr)
	if !ok {
		return false // only TCP peers can be matched
	}
	ip, ok := netip.AddrFromSlice(ta.IP)
	if !ok {
		return false
	}
	ip = ip.Unmap()
	for _, p := range allow {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

func addrString(a net.Addr) string {
	if a == nil {
		return "<unknown>"
	}
	return a.String()
}

// quote quotes a client-supplied string for a remark, cut to 64 bytes.
func quote(s string) string {
	if len(s) > 64 {
		s = s[:64] + "…"
	}
	return strconv.Quote(s)
}
