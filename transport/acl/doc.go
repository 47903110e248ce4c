// Package acl is runnel's access control and transport security for the
// name server and the broker: RocketMQ-compatible request signing
// (AccessKey / Signature, protocol §8), per-account permissions on topics,
// consumer groups and request codes, a global IP allow-list, and the TLS
// modes of a server port.
//
// # Configuration
//
// An ACL file is JSON (the standard library reads it: no YAML library is a
// dependency of runnel, and JSON needs none). Unknown keys are errors. For
// example:
//
//	{
//	  "allowCIDRs": ["10.0.0.0/8", "127.0.0.1/32"],
//	  "acceptUnsignedSecurityToken": false,
//	  "accounts": [
//	    {"accessKey": "ops-admin", "secretKey": "…", "admin": true},
//	    {"accessKey": "orders-app", "secretKey": "…",
//	     "defaultTopicPerm": "DENY", "defaultGroupPerm": "DENY",
//	     "topicPerms": {"orders": "PUB|SUB", "audit": "PUB"},
//	     "groupPerms": {"orders-billing": "SUB"}}
//	  ]
//	}
//
// The file is validated when loaded (validator struct tags plus
// Config.Validate for the rules across fields), and every problem is
// reported by its JSON path. Policy.Reload reads it again, for SIGHUP: the
// new file takes effect only when valid. Nothing on the wire can change it.
//
// # What a request needs
//
// Policy.Check, installed on a remoting.Server by Policy.ServerOption (a
// remoting interceptor, so it runs before any processor and sees request
// codes no processor handles), judges each request in order:
//
//  1. When allowCIDRs is not empty, the peer's address must be in it.
//  2. The AccessKey extField must name an account.
//  3. The Signature extField must equal Base64(HmacSHA1(secretKey,
//     content)), content being the values of every extField but Signature,
//     ordered by key (byte order), followed by the body; compared in
//     constant time (hmac.Equal).
//  4. The request code must be in the table (see Requirement): admin codes
//     (topic and group administration, configuration, broker registration,
//     KV writes, statistics) need an admin account; send codes need PUB on
//     the topic; pull and offset codes need SUB on the topic and the
//     consumer group; HEART_BEAT needs SUB on every consumer group and
//     subscribed topic of its body; routes need PUB or SUB on the topic.
//     A retry topic %RETRY%<group> is authorised as its group (SUB), as in
//     RocketMQ. Codes missing from the table are refused.
//
// A denied request is answered NO_PERMISSION (16) with a remark starting
// with "acl: " that says which step failed; it reaches no processor.
//
// Differences from RocketMQ, on purpose:
//   - RocketMQ's global white remote addresses skip every check: a request
//     from such an address needs no signature at all. runnel's allow-list
//     only restricts: an allowed address still needs a valid signature, so
//     that an address (spoofable behind NAT, shared on a host, reused in a
//     cluster) never stands in for a credential.
//   - Admin accounts have PUB|SUB on every topic and group (RocketMQ 4
//     still applies their topic permissions).
//   - Codes RocketMQ lets any signed request use (its ACL table is
//     incomplete) are refused unless the table lists them.
//
// # SecurityToken
//
// The Java client and server sign the SecurityToken extField like any
// other. The official Go client (rocketmq-client-go) adds it after
// computing the signature, so its signatures never cover the token and a
// Java-compatible server refuses them whenever a token is configured. With
// acceptUnsignedSecurityToken, a request whose signature does not match is
// checked a second time without the token. This loses nothing runnel
// relies on: runnel does not interpret the token (it has no temporary
// credentials service); the signature still binds the AccessKey, every
// other header and the body to the secret key. It is off by default.
//
// # Signing
//
// Sign signs a command the way RocketMQ's Java client does; the broker uses
// it for its own requests to name servers (REGISTER_BROKER is an admin
// code, so a broker needs an admin account when the name server has ACL).
//
// # TLS
//
// TLSMode (disabled, permissive, enforcing; anything else is an error),
// ServerTLSConfig (certificate, key, optional client CA for mutual TLS) and
// TLSServerOptions build the remoting options of a server port.
// ResolveTLSMode encodes the rule that ACL implies enforcing TLS unless a
// mode is given explicitly.
//
// # Concurrency
//
// A Policy is safe for concurrent use; a configuration is swapped
// atomically, so each request is judged by one configuration. Check does
// not block and allocates nothing for an allowed request once warm (except
// for HEART_BEAT and lock bodies, which are decoded).
package acl
