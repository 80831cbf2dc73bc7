package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"strings"
	"time"
)

// Signer signs wsproxy's own tokens — panel sessions, and the thread tokens the admin REST
// issues (panel links, MCP tokens) — with a key derived from the admin token: every replica
// configured alike accepts them, and a new admin token ends them all.
type Signer struct{ key []byte }

// NewSigner returns the signer of adminToken's tokens. Without an admin token there is no key:
// every token is refused (a key derived from nothing would be anyone's).
func NewSigner(adminToken string) Signer {
	if adminToken == "" {
		return Signer{}
	}
	k := sha256.Sum256([]byte("wsproxy panel signing key\n" + adminToken))
	return Signer{key: k[:]}
}

// Kinds of signed tokens: the kind keeps one from passing for another.
const (
	KindSession   = "s" // a panel session's cookie
	KindPanelLink = "l" // a panel link's token
	KindMCP       = "m" // an MCP thread token
)

var b64 = base64.RawURLEncoding

// Sign is kind.payload.mac, the payload v's JSON.
func (s Signer) Sign(kind string, v any) string {
	b, _ := json.Marshal(v)
	payload := kind + "." + b64.EncodeToString(b)
	return payload + "." + b64.EncodeToString(s.mac(payload))
}

func (s Signer) mac(payload string) []byte {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(payload))
	return m.Sum(nil)
}

// fingerprint is a MAC of the key hashes hashes under the label ("" without a signing key).
func (s Signer) fingerprint(label string, hashes ...[32]byte) string {
	if s.key == nil {
		return ""
	}
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte("client key fingerprint\n" + label + "\n"))
	for _, h := range hashes {
		m.Write(h[:])
	}
	return b64.EncodeToString(m.Sum(nil)[:16])
}

// Verify decodes a token of kind into v when its signature holds.
func (s Signer) Verify(kind, token string, v any) bool {
	i := strings.LastIndexByte(token, '.')
	if s.key == nil || i < 0 || !strings.HasPrefix(token, kind+".") {
		return false
	}
	mac, err := b64.DecodeString(token[i+1:])
	if err != nil || !hmac.Equal(mac, s.mac(token[:i])) {
		return false
	}
	b, err := b64.DecodeString(token[len(kind)+1 : i])
	return err == nil && json.Unmarshal(b, v) == nil
}

// ThreadToken is what a thread's token says: the thread it is bound to (stored form), its id
// among the thread's links (tools.Link), when it expires, and — for a client's thread — the
// fingerprint of the keys it was made under (Guard.Holds).
type ThreadToken struct {
	Thread  string `json:"t"`
	ID      int64  `json:"i"`
	Expires int64  `json:"e"` // Unix seconds
	Key     string `json:"k,omitempty"`
}

// VerifyThreadToken decodes a thread token of kind whose signature holds, that names a link and
// has not expired. Whether it was revoked is its link's to say (tools.Workspace.LinkValid).
func (s Signer) VerifyThreadToken(kind, token string) (ThreadToken, bool) {
	var t ThreadToken
	if !s.Verify(kind, token, &t) || t.Thread == "" || t.ID <= 0 || time.Now().Unix() >= t.Expires {
		return ThreadToken{}, false
	}
	return t, true
}
