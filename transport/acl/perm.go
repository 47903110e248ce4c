package acl

import (
	"fmt"
	"strings"
)

// Perm is a permission on a topic or a consumer group, as in RocketMQ's
// plain ACL: PermDeny (the zero value), PermPub, PermSub or both.
type Perm uint8

const (
	// PermDeny grants nothing ("DENY").
	PermDeny Perm = 0
	// PermPub allows sending to a topic ("PUB").
	PermPub Perm = 1 << 0
	// PermSub allows consuming a topic or acting as a consumer group
	// ("SUB").
	PermSub Perm = 1 << 1
	// PermPubSub is PermPub|PermSub ("PUB|SUB").
	PermPubSub = PermPub | PermSub
)

// ParsePerm parses "PUB", "SUB", "PUB|SUB" (or "SUB|PUB") or "DENY", in
// any letter case and with spaces around "|". The empty string is an error:
// callers decide what an absent permission means.
func ParsePerm(s string) (Perm, error) {
	var p Perm
	switch strings.ToUpper(strings.ReplaceAll(s, " ", "")) {
	case "DENY":
		p = PermDeny
	case "PUB":
		p = PermPub
	case "SUB":
		p = PermSub
	case "PUB|SUB", "SUB|PUB":
		p = PermPubSub
	default:
		return 0, fmt.Errorf("acl: permission %q: want PUB, SUB, PUB|SUB or DENY", s)
	}
	return p, nil
}

// String returns the configuration form of p.
func (p Perm) String() string {
	switch p & PermPubSub {
	case PermPub:
		return "PUB"
	case PermSub:
		return "SUB"
	case PermPubSub:
		return "PUB|SUB"
	}
	return "DENY"
}

// Allows reports whether p grants every bit of need; a zero need is never
// granted.
func (p Perm) Allows(need Perm) bool { return need != 0 && p&need == need }
