package protocol

import (
	"bytes"
	"fmt"
	"strings"
)

// commandsEqual compares every field of two commands, extFields in order;
// a nil and an empty Body are equal.
func commandsEqual(a, b *Command) bool {
	if a.Code != b.Code || a.Language != b.Language || a.Version != b.Version ||
		a.Opaque != b.Opaque || a.Flag != b.Flag || a.Remark != b.Remark ||
		!bytes.Equal(a.Body, b.Body) || a.NumExt() != b.NumExt() {
		return false
	}
	for i := range a.NumExt() {
		if a.ExtAt(i) != b.ExtAt(i) {
			return false
		}
	}
	return true
}

func dumpCommand(c *Command) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "{code=%d lang=%v ver=%d opaque=%d flag=%d remark=%q ext=[", c.Code, c.Language, c.Version, c.Opaque, c.Flag, c.Remark)
	for i := range c.NumExt() {
		f := c.ExtAt(i)
		fmt.Fprintf(&sb, "%q:%q ", f.Key, f.Value)
	}
	fmt.Fprintf(&sb, "] body=%q}", c.Body)
	return sb.String()
}
