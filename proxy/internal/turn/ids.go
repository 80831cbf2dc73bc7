package turn

import (
	"crypto/rand"
	"encoding/hex"
)

// The ids the proxy makes up where an upstream gave none.

func newCallID() string { return "call_" + randomHex(12) }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// messageID is a turn's id: its first message's, or one made up when the upstream gave none.
func messageID(first string) string {
	if first != "" {
		return first
	}
	return "msg_" + randomHex(12)
}

// turnID is a turn's id: its first response's, or one made up when the upstream gave none.
func turnID(first string) string {
	if first != "" {
		return first
	}
	return "resp_" + randomHex(24)
}
