package client

// This file documents the seam between the client core (client.go, route.go,
// producer*.go, pull.go, admin.go, acl.go) and the consumer-group machinery
// (group*.go, allocate*.go, lock*.go). The core implements these methods on
// *Client; the group code uses only them:
//
//	func (c *Client) ClientID() string
//	    "<ip>@<instance>", unique per Client (instance defaults to "<pid>#<nanotime>").
//	func (c *Client) Route(ctx context.Context, topic string) (*TopicRoute, error)
//	    cached route, refreshed every route-refresh interval; errors wrap
//	    protocol.ErrTopicNotExist when the name servers know no such topic.
//	    TopicRoute: SubscribeQueues, PublishQueues, MasterAddr, BrokerAddr, BrokerNames.
//	func (c *Client) invoke(ctx context.Context, addr string, req *protocol.Command) (*protocol.Command, error)
//	    one request on the pooled connection to addr, ACL-signed; err only for
//	    transport failures (a response of any code is returned as is; use
//	    protocol.ResponseError). Without a ctx deadline the request timeout applies.
//	func (c *Client) invokeOneway(ctx context.Context, addr string, req *protocol.Command) error
//	func (c *Client) registerConsumer(group string, data func() protocol.ConsumerData) (unregister func())
//	    heartbeats then carry data() to every broker address of every topic it subscribes.
//	func (c *Client) heartbeatNow(ctx context.Context) error
//	    one immediate heartbeat round to all brokers in use.
//	func (c *Client) handleServerRequest(code int32, h func(ctx context.Context, brokerAddr string, req *protocol.Command) *protocol.Command) (remove func())
//	    server-initiated requests (NOTIFY_CONSUMER_IDS_CHANGED 40, RESET_CONSUMER_CLIENT_OFFSET 220,
//	    GET_CONSUMER_RUNNING_INFO 307, …); every handler of the code runs, in
//	    registration order; the first non-nil response is sent.
//	func (c *Client) logger() *slog.Logger
//	func (c *Client) goStart(name string, fn func(ctx context.Context)) bool
//	    runs fn on a goroutine Close cancels (ctx) and joins; false after Close began.
