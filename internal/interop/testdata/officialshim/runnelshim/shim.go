// Added to a private copy of the official client by runnel's scripts/bench.sh;
// not part of upstream.

// Package runnelshim gives runnel's benchmarks access to the official
// client's frame codec (package internal/remote), which no other module can
// import. It adds no logic: each function calls the official code.
package runnelshim

import (
	"io"

	"github.com/apache/rocketmq-client-go/v2/internal/remote"
)

// Command wraps the official *remote.RemotingCommand.
type Command struct{ c *remote.RemotingCommand }

// mapHeader is a CustomHeader whose extFields are a ready map.
type mapHeader map[string]string

func (h mapHeader) Encode() map[string]string { return h }

// NewRequest builds a request as the official client does
// (remote.NewRemotingCommand: language GO, version 317, next opaque) with
// ext as its extFields map (used as is, not copied).
func NewRequest(code int16, ext map[string]string, body []byte) *Command {
	return &Command{c: remote.NewRemotingCommand(code, mapHeader(ext), body)}
}

// WriteTo writes the frame with the official encoder, as the client does
// for every request it sends.
func (c *Command) WriteTo(w io.Writer) error { return c.c.WriteTo(w) }

// Decode decodes a frame (without its total-length word) with the official
// decoder, as the client does for every frame it reads.
func Decode(frame []byte) (*Command, error) {
	c, err := remote.RunnelShimDecode(frame)
	if err != nil {
		return nil, err
	}
	return &Command{c: c}, nil
}

// Code, Language, Version, Opaque, Flag, Remark, Ext and Body return the
// decoded fields.
func (c *Command) Code() int16            { return c.c.Code }
func (c *Command) Language() byte         { return byte(c.c.Language) }
func (c *Command) Version() int16         { return c.c.Version }
func (c *Command) Opaque() int32          { return c.c.Opaque }
func (c *Command) Flag() int32            { return c.c.Flag }
func (c *Command) Remark() string         { return c.c.Remark }
func (c *Command) Ext() map[string]string { return c.c.ExtFields }
func (c *Command) Body() []byte           { return c.c.Body }

// UseRocketMQHeaders makes WriteTo use the ROCKETMQ binary header encoding
// until restore is called. It changes the official package's global: call
// it only while no official client runs.
func UseRocketMQHeaders() (restore func()) {
	old := remote.RunnelShimSetCodecType(1)
	return func() { remote.RunnelShimSetCodecType(old) }
}
