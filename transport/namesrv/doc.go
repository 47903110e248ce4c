// Package namesrv is runnel's embedded, RocketMQ-compatible name server.
//
// Brokers (runnel's own and Java brokers) register with it over the remoting
// protocol (REGISTER_BROKER, re-sent every 30 s over one long-lived
// connection) and clients look up topic routes (GET_ROUTEINFO_BY_TOPIC). It
// also answers the admin requests of the Java and Go admin tools: cluster
// info, topic lists, topic deletion, broker write permission, KV config.
//
// # Usage
//
//	srv, err := namesrv.New(namesrv.WithListenAddr("127.0.0.1:0"))
//	if err != nil { … }
//	if err := srv.Start(ctx); err != nil { … }
//	defer srv.Close()
//	addr := srv.Addr() // give it to brokers and clients
//
// # Liveness
//
// A broker address stays registered while it re-registers within its
// timeout (the request's heartbeatTimeoutMillis, else WithBrokerExpiry,
// 120 s by default); a scanner run every WithScanInterval evicts stale ones
// and closes their connection. An address is also evicted at once when the
// connection it last registered on closes, as Java's BrokerHousekeepingService
// does. Evicting a broker group's last address removes the group, its
// cluster membership and its queue data; topics left without queue data
// disappear.
//
// # Access control and TLS
//
// WithACL installs an acl.Policy: every request must then be signed by one
// of its accounts, and REGISTER_BROKER, UNREGISTER_BROKER, the KV writes and
// the other administration codes need an admin account (so brokers
// register with admin credentials); routes need PUB or SUB on the topic.
// WithTLS sets the port's TLS mode (disabled, permissive or enforcing).
//
// # Differences from the Java name server
//
//   - Routes are always sent as compact standard JSON (quoted brokerAddrs
//     keys), which the Go and Java clients both parse, whatever the request
//     version.
//   - UPDATE_NAMESRV_CONFIG is refused with NO_PERMISSION: remote
//     configuration writes are a known RocketMQ remote-code-execution vector.
//   - A first registration carrying exactly one topic is rejected, as Java
//     does, but without leaving a half-registered broker group behind.
//   - Registrations are checked: topic names must be 1..MaxTopicNameLen bytes
//     and queue counts within [0, MaxQueueNums].
//   - A registration that contradicts a live broker's is refused with
//     SYSTEM_ERROR and a remark starting ConflictRemark, and logged: a second
//     master (broker id 0 at another address) of a broker name whose master
//     is registered, or a broker name registered in another cluster than the
//     one it is live in. Java's name server takes both (a master with a newer
//     state version replaces the other), so that two masters of one name
//     take turns in the routes.
//   - Acting-master mode, static topics, filter-server routing and the
//     controller codes are not implemented.
//
// # Non-obvious invariants
//
//   - The route tables (topics, brokers, clusters, live brokers) are guarded
//     by one mutex; the KV config by another. The two are never held
//     together: handlers read the KV table first, then the routes.
//   - A live entry remembers the connection it was last registered on; a
//     closing connection evicts only the entries that still point at it, so
//     a broker that reconnected is not evicted by its old connection.
//   - KV writes are persisted (temp file, fsync, rename, dir fsync) before
//     they are acknowledged; a failed write leaves memory unchanged.
package namesrv
