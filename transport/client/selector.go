package client

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// Selector chooses the messages of a subscription: a TAG expression
// ("*" = all, "a || b") or an SQL92 expression over message properties
// (Java's MessageSelector). Brokers filter by both; the client filters by
// TAG again (brokers compare tag hash codes only).
type Selector struct {
	// Type is protocol.ExpressionTypeTag ("" means TAG) or
	// protocol.ExpressionTypeSQL92.
	Type string
	// Expression is the expression text.
	Expression string
}

// ByTag selects by a TAG expression ("" or "*" = every message).
func ByTag(expr string) Selector { return Selector{Type: protocol.ExpressionTypeTag, Expression: expr} }

// BySQL92 selects by an SQL92 expression over message properties
// ("color = 'red' AND price > 10"), evaluated by the broker (RocketMQ
// brokers need enablePropertyFilter=true; runnel's broker
// broker.WithPropertyFilter). The broker parses it: an expression it
// cannot parse fails the consumer's Start (CHECK_CLIENT_CONFIG) or its
// pulls (SUBSCRIPTION_PARSE_FAILED).
func BySQL92(expr string) Selector {
	return Selector{Type: protocol.ExpressionTypeSQL92, Expression: expr}
}

func (s Selector) isTag() bool { return s.Type == "" || s.Type == protocol.ExpressionTypeTag }

// subscription builds the heartbeat's SubscriptionData, as Java's
// FilterAPI.build does.
func (s Selector) subscription(topic string, version int64) (protocol.SubscriptionData, error) {
	if s.isTag() {
		return protocol.NewTagSubscription(topic, s.Expression, version), nil
	}
	if s.Type != protocol.ExpressionTypeSQL92 {
		return protocol.SubscriptionData{}, fmt.Errorf("%w: unknown selector type %q", ErrInvalidOption, s.Type)
	}
	if strings.TrimSpace(s.Expression) == "" {
		return protocol.SubscriptionData{}, fmt.Errorf("%w: empty SQL92 selector", ErrInvalidOption)
	}
	return protocol.SubscriptionData{Topic: topic, SubString: s.Expression, ExpressionType: s.Type,
		SubVersion: version, TagsSet: []string{}, CodeSet: protocol.TagCodes{}}, nil
}

// retryPrefix and dlqPrefix start the names of a group's retry and
// dead-letter topics (Java MixAll).
const (
	retryPrefix = "%RETRY%"
	dlqPrefix   = "%DLQ%"
)

func isRetryTopic(t string) bool { return strings.HasPrefix(t, retryPrefix) }

// RetryTopic returns the name of group's retry topic, %RETRY%<group>.
func RetryTopic(group string) string { return retryPrefix + group }

// DLQTopic returns the name of group's dead-letter topic, %DLQ%<group>.
func DLQTopic(group string) string { return dlqPrefix + group }

// checkSelectors sends CHECK_CLIENT_CONFIG for every subscription that is
// not a TAG expression to a broker of its topic (Java's
// MQClientInstance.checkClientInBroker, at a consumer's start): a broker
// that cannot serve the selector answers an error, which fails Start.
func (g *GroupConsumer) checkSelectors(ctx context.Context) error {
	g.mu.Lock()
	var sds []protocol.SubscriptionData
	for _, sd := range g.mu.subs {
		if sd.ExpressionType != "" && sd.ExpressionType != protocol.ExpressionTypeTag {
			sds = append(sds, sd)
		}
	}
	g.mu.Unlock()
	for i := range sds {
		sd := &sds[i]
		route, err := g.c.Route(ctx, sd.Topic)
		if err != nil {
			return fmt.Errorf("client: group %s: route of %s: %w", g.group, sd.Topic, err)
		}
		var addr string
		for _, bn := range route.BrokerNames() {
			if a, ok := route.MasterAddr(bn); ok {
				addr = a
				break
			}
		}
		if addr == "" {
			continue // nobody to ask (Java skips too)
		}
		body := protocol.CheckClientRequestBody{ClientID: g.c.ClientID(), Group: g.group, SubscriptionData: sd}
		b, err := body.Encode()
		if err != nil {
			return err
		}
		req := protocol.NewRequest(protocol.ReqCheckClientConfig)
		req.Body = b
		rctx, cancel := context.WithTimeout(ctx, g.cfg.timeout)
		resp, err := g.c.invoke(rctx, addr, req)
		cancel()
		if err == nil {
			err = protocol.ResponseError(resp)
		}
		if err != nil {
			if errors.Is(err, protocol.ErrRequestCodeNotSupported) {
				err = fmt.Errorf("the broker does not support %s selectors: %w", sd.ExpressionType, err)
			}
			return fmt.Errorf("client: group %s: %s selector of %s refused by %s: %w", g.group, sd.ExpressionType, sd.Topic, addr, err)
		}
	}
	return nil
}
