// Package client is runnel's RocketMQ client: name-server routes,
// producers, pull primitives, offsets, admin calls and consumer groups, over
// the remoting protocol (package remoting) with the codecs of package
// protocol. It works against Apache RocketMQ 4.x/5.x clusters and runnel's
// embedded broker.
//
// # Client
//
// New returns a Client: the name servers (fixed addresses, or fetched from
// an HTTP address service), a route cache refreshed every 30 s, one
// multiplexed connection per broker address (re-dialled with backoff when it
// breaks), heartbeats every 30 s to the brokers in use, ACL signing and TLS.
// Everything else is made from a Client. Close stops and joins every
// goroutine the Client, its producers and its consumer groups started.
package client
