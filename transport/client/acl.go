package client

import (
	"crypto/hmac"
	"crypto/sha1"
	"encoding/base64"
	"hash"
	"slices"
	"strings"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// Credentials are the ACL credentials a Client signs requests with
// (protocol §8). SecurityToken is optional (temporary credentials).
type Credentials struct {
	AccessKey     string
	SecretKey     string
	SecurityToken string
}

// ExtField keys of ACL signing.
const (
	aclAccessKey     = "AccessKey"
	aclSignature     = "Signature"
	aclSecurityToken = "SecurityToken"
)

// signer holds reusable buffers for signing; pooled per Client.
type signer struct {
	keys []int
	buf  []byte
	mac  hash.Hash
	key  string
	out  []byte
}

func newSigner() *signer { return &signer{} }

// sign adds AccessKey, SecurityToken (when set) and Signature to req when
// the Client has credentials.
func (c *Client) sign(req *protocol.Command) {
	cr := c.cfg.creds
	if cr == nil {
		return
	}
	s := c.signers.Get().(*signer)
	signCommand(req, *cr, s)
	c.signers.Put(s)
}

// signCommand signs cmd as RocketMQ's AclClientRPCHook does: it sets the extFields
// AccessKey and (when non-empty) SecurityToken, then Signature =
// Base64(HmacSHA1(SecretKey, values of all extFields but Signature in key
// order, concatenated, followed by the body)). Unlike rocketmq-client-go,
// the SecurityToken is part of the signed content, as the Java server
// expects. s holds reusable buffers.
func signCommand(cmd *protocol.Command, cr Credentials, s *signer) {
	cmd.SetExt(aclAccessKey, cr.AccessKey)
	if cr.SecurityToken != "" {
		cmd.SetExt(aclSecurityToken, cr.SecurityToken)
	}
	cmd.DeleteExt(aclSignature)
	s.keys = s.keys[:0]
	for i := range cmd.NumExt() {
		s.keys = append(s.keys, i)
	}
	// Java sorts with a TreeMap<String,String>: UTF-16 code unit order, which
	// equals byte order for the ASCII keys RocketMQ uses.
	slices.SortFunc(s.keys, func(a, b int) int { return strings.Compare(cmd.ExtAt(a).Key, cmd.ExtAt(b).Key) })
	s.buf = s.buf[:0]
	for _, i := range s.keys {
		s.buf = append(s.buf, cmd.ExtAt(i).Value...)
	}
	s.buf = append(s.buf, cmd.Body...)
	if s.mac == nil || s.key != cr.SecretKey {
		s.mac, s.key = hmac.New(sha1.New, []byte(cr.SecretKey)), cr.SecretKey
	}
	s.mac.Reset()
	s.mac.Write(s.buf)
	var sum [sha1.Size]byte
	s.out = base64.StdEncoding.AppendEncode(s.out[:0], s.mac.Sum(sum[:0]))
	cmd.SetExt(aclSignature, string(s.out))
}
