package acl

import (
	"crypto/hmac"
	"crypto/sha1"
	"encoding/base64"
	"hash"
	"slices"
	"strings"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// ExtField keys of RocketMQ's ACL signing (Java SessionCredentials).
const (
	KeyAccessKey     = "AccessKey"
	KeySignature     = "Signature"
	KeySecurityToken = "SecurityToken"
	// keyUniqueKeyQuery is excluded from the signed content of requests
	// from versions up to V4_9_3 (399), as RocketMQ 5.3's server does: old
	// clients add it after signing.
	keyUniqueKeyQuery = "_UNIQUE_KEY_QUERY"
	versionV4_9_3     = 399
)

// signatureLen is the length of a Base64 (padded) HMAC-SHA1.
var signatureLen = base64.StdEncoding.EncodedLen(sha1.Size)

// Credentials are what a request is signed with.
type Credentials struct {
	AccessKey     string
	SecretKey     string
	SecurityToken string // optional; signed when set
}

// Sign signs cmd as RocketMQ's Java AclClientRPCHook does (protocol §8):
// it sets the extFields AccessKey and, when cr has one, SecurityToken, then
// Signature = Base64(HmacSHA1(SecretKey, content)) where content is the
// values of every extField but Signature in byte order of their keys,
// concatenated, followed by the body. Re-signing a signed command gives the
// same result. Set every extField and the body before signing: anything
// changed afterwards breaks the signature. Not safe for concurrent use on
// one cmd.
func Sign(cmd *protocol.Command, cr Credentials) {
	cmd.SetExt(KeyAccessKey, cr.AccessKey)
	if cr.SecurityToken != "" {
		cmd.SetExt(KeySecurityToken, cr.SecurityToken)
	}
	cmd.DeleteExt(KeySignature)
	mac := hmac.New(sha1.New, []byte(cr.SecretKey))
	var s scratch
	cmd.SetExt(KeySignature, string(s.signature(mac, cmd, false)))
}

// Signature returns the signature RocketMQ's server expects on cmd for the
// given secret key: Base64(HmacSHA1(secret, content)), content as for Sign
// (the SecurityToken included, as Java computes it).
func Signature(cmd *protocol.Command, secretKey string) string {
	var s scratch
	return string(s.signature(hmac.New(sha1.New, []byte(secretKey)), cmd, false))
}

// scratch holds the reusable buffers of signature computations; a Policy
// pools them so that verifying allocates nothing once warm.
type scratch struct {
	idx     []int
	content []byte
	sum     [sha1.Size]byte
	sig     [28]byte
}

// signature computes the Base64 signature of cmd with mac (keyed with the
// secret), into s.sig. withoutToken leaves SecurityToken out of the
// content, as rocketmq-client-go does.
//
// When a decoded header repeats a key, only its last value is signed: the
// value Command.Ext, the processors and Java's HashMap all see, so that a
// repeated key can never make the signed value differ from the one
// authorised.
func (s *scratch) signature(mac hash.Hash, cmd *protocol.Command, withoutToken bool) []byte {
	idx := s.idx[:0]
	defer func() { s.idx = idx }()
	oldClient := cmd.Version <= versionV4_9_3
	for i := range cmd.NumExt() {
		switch cmd.ExtAt(i).Key {
		case KeySignature:
			continue
		case keyUniqueKeyQuery:
			if oldClient {
				continue
			}
		case KeySecurityToken:
			if withoutToken {
				continue
			}
		}
		idx = append(idx, i)
	}
	// Java sorts with TreeMap<String,String>: UTF-16 code units, which is
	// byte order for the ASCII keys RocketMQ uses. Stable, so that the last
	// of repeated keys stays last.
	slices.SortStableFunc(idx, func(a, b int) int { return strings.Compare(cmd.ExtAt(a).Key, cmd.ExtAt(b).Key) })
	content := s.content[:0]
	for n, i := range idx {
		if n+1 < len(idx) && cmd.ExtAt(idx[n+1]).Key == cmd.ExtAt(i).Key {
			continue // a later value of the same key wins
		}
		content = append(content, cmd.ExtAt(i).Value...)
	}
	s.content = content
	mac.Reset()
	mac.Write(content)
	mac.Write(cmd.Body)
	base64.StdEncoding.Encode(s.sig[:], mac.Sum(s.sum[:0]))
	return s.sig[:]
}
