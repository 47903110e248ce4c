package broker

import (
	"sync"
	"time"

	"github.com/runnel-dev/runnel/transport/broker/internal/sql92"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// Message filters of the pull path: TAG expressions (by tags code, then
// tag string) and, with WithPropertyFilter, SQL92 property selectors
// (protocol §4.8, RocketMQ's ExpressionMessageFilter). A SQL92 selector is
// compiled once per distinct expression (exprCache) and evaluated over each
// scanned message's properties, on the first processing of a pull and
// again when a parked pull wakes (pullOnce scans from where the last scan
// of the parked pull ended). RocketMQ's consume-queue bloom filter is an
// optimisation of the same evaluation and is not reproduced.

// filterConfig holds the filter options.
type filterConfig struct {
	// propertyFilter is Java's enablePropertyFilter: SQL92 subscriptions
	// are served (else refused with SYSTEM_ERROR, as Java does).
	propertyFilter bool
}

// WithPropertyFilter enables SQL92 property filtering (Java's
// enablePropertyFilter, off by default as in RocketMQ). Off, consumers
// that select by SQL92 are refused with SYSTEM_ERROR "The broker does not
// support consumer to filter message by SQL92", on CHECK_CLIENT_CONFIG and
// on pulls, as a Java broker refuses them.
func WithPropertyFilter(on bool) Option {
	return optionFunc(func(c *config) { c.filter.propertyFilter = on })
}

// msgFilter selects the messages of one pull.
type msgFilter struct {
	tag tagFilter
	sql *sql92.Expr // SQL92 selector; the tag filter is unused then
}

var matchAll = msgFilter{tag: tagFilter{all: true}}

func (f *msgFilter) match(rec []byte, code int64) bool {
	if f.sql == nil {
		return f.tag.match(rec, code)
	}
	m, _, err := protocol.DecodeRecord(rec)
	if err != nil {
		return false
	}
	return f.sql.MatchProperties(m.Properties)
}

// isTagType is Java's ExpressionType.isTagType.
func isTagType(t string) bool { return t == "" || t == protocol.ExpressionTypeTag }

// maxCachedExprs bounds exprCache (Java's SelectorParser keeps 100).
const maxCachedExprs = 256

// exprCache holds compiled SQL92 selectors, and the errors of those that
// do not compile, by expression text. Safe for concurrent use; the zero
// value is ready.
type exprCache struct {
	mu sync.Mutex
	m  map[string]exprEntry
}

type exprEntry struct {
	expr *sql92.Expr
	err  error
}

// compile returns the compiled form of a selector of type typ: SQL92, or a
// SUBSCRIPTION_PARSE_FAILED-worthy error for other types and bad text.
func (c *exprCache) compile(typ, expr string) (*sql92.Expr, error) {
	if typ != protocol.ExpressionTypeSQL92 {
		return nil, &protocol.Error{Code: protocol.ResSubscriptionParseFailed, Remark: "unknown expression type " + typ}
	}
	c.mu.Lock()
	e, ok := c.m[expr]
	c.mu.Unlock()
	if ok {
		return e.expr, e.err
	}
	x, err := sql92.Parse(expr)
	e = exprEntry{expr: x, err: err}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxCachedExprs {
		c.m = make(map[string]exprEntry)
	}
	c.m[expr] = e
	c.mu.Unlock()
	return x, err
}

// requestFilter is the filter of a pull carrying its subscription (the
// SUBSCRIPTION flag), in Java's order: the expression is parsed first
// (SUBSCRIPTION_PARSE_FAILED), then a SQL92 one needs enablePropertyFilter
// (SYSTEM_ERROR).
func (b *Broker) requestFilter(req *protocol.Command, h *protocol.PullMessageRequestHeader) (msgFilter, *protocol.Command) {
	if isTagType(h.ExpressionType) {
		return msgFilter{tag: newTagFilter(protocol.ParseTagExpression(h.Subscription).Tags)}, nil
	}
	x, err := b.filters.compile(h.ExpressionType, h.Subscription)
	if err != nil {
		return msgFilter{}, respond(req, protocol.ResSubscriptionParseFailed, "parse the consumer's subscription failed")
	}
	if !b.cfg.filter.propertyFilter {
		return msgFilter{}, respond(req, protocol.ResSystemError, "The broker does not support consumer to filter message by "+h.ExpressionType)
	}
	return msgFilter{sql: x}, nil
}

// registeredFilter is the filter of a subscription registered by
// heartbeat: a SQL92 one whose expression does not compile has no filter
// data (FILTER_DATA_NOT_EXIST, as Java's ConsumerFilterManager keeps none),
// and needs enablePropertyFilter (SYSTEM_ERROR).
func (b *Broker) registeredFilter(req *protocol.Command, sub *Subscription) (msgFilter, *protocol.Command) {
	if sub.ClassFilter {
		return matchAll, nil
	}
	if isTagType(sub.ExpressionType) {
		return msgFilter{tag: newTagFilter(sub.Tags)}, nil
	}
	x, err := b.filters.compile(sub.ExpressionType, sub.Expression)
	if err != nil || sub.Expression == "" {
		return msgFilter{}, respond(req, protocol.ResFilterDataNotExist,
			"The broker's consumer filter data is not exist!Your expression may be wrong!")
	}
	if !b.cfg.filter.propertyFilter {
		return msgFilter{}, respond(req, protocol.ResSystemError, "The broker does not support consumer to filter message by "+sub.ExpressionType)
	}
	return msgFilter{sql: x}, nil
}

// checkClientConfig answers CHECK_CLIENT_CONFIG (46) as Java's
// ClientManageProcessor.checkClientConfig: TAG subscriptions (or none) are
// fine; others need enablePropertyFilter (SYSTEM_ERROR) and an expression
// that compiles (SUBSCRIPTION_PARSE_FAILED with the parser's message).
func (b *Broker) checkClientConfig(req *protocol.Command, sd *protocol.SubscriptionData) *protocol.Command {
	if sd == nil || isTagType(sd.ExpressionType) {
		return protocol.NewResponse(req, protocol.ResSuccess, "")
	}
	if !b.cfg.filter.propertyFilter {
		return protocol.NewResponse(req, protocol.ResSystemError,
			"The broker does not support consumer to filter message by "+sd.ExpressionType)
	}
	if _, err := b.filters.compile(sd.ExpressionType, sd.SubString); err != nil {
		return protocol.NewResponse(req, protocol.ResSubscriptionParseFailed, err.Error())
	}
	return protocol.NewResponse(req, protocol.ResSuccess, "")
}

// noneMatched answers a pull whose scan found only messages the filter
// dropped, up to next: PULL_RETRY_IMMEDIATELY with next, as Java answers
// on a pull's first processing. A parked pull that woke up for such
// messages is parked again, scanning from next on its next wake-up, until
// its suspend time ends (Java's PullRequestHoldService wakes a held pull
// only for a message its filter matches).
func (b *Broker) noneMatched(p *pullReq, allowSuspend bool, next, minOff, maxOff int64) {
	if !allowSuspend && p.h.SysFlag&protocol.PullFlagSuspend != 0 {
		if d := time.Until(p.deadline); d > 0 {
			p.scanFrom = next
			if b.lp.park(p, d) == parked {
				return
			}
		}
	}
	b.answerPull(p, protocol.ResPullRetryImmediately, statusNoMatched, next, minOff, maxOff, nil)
}
