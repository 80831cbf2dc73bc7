package testkit

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// PanelClient is a browser-like client of the panel: a cookie jar, and the headers a
// same-origin page sends.
type PanelClient struct {
	t    testing.TB
	Base string       // the server's URL
	HTTP *http.Client // with the cookie jar
	CSRF string       // the session's CSRF token, once signed in
}

// NewPanelClient is a panel client of the server at base, signed in to nothing.
func NewPanelClient(t testing.TB, base string) *PanelClient {
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &PanelClient{t: t, Base: base, HTTP: &http.Client{Jar: jar}}
}

// Do sends a request with its cookies and header: the answer's status and body.
func (c *PanelClient) Do(method, path, body string, header map[string]string) (int, string) {
	c.t.Helper()
	req, err := http.NewRequest(method, c.Base+path, strings.NewReader(body))
	require.NoError(c.t, err)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := c.HTTP.Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Write sends a write as the panel's page does: same origin, with the CSRF token.
func (c *PanelClient) Write(method, path, body string) (int, string) {
	return c.Do(method, path, body, map[string]string{"X-CSRF-Token": c.CSRF, "Origin": c.Base, "Sec-Fetch-Site": "same-origin", "Content-Type": "application/json"})
}

// SignIn signs in with token: the answer's status. Signed in, the client keeps the session's
// CSRF token for its writes.
func (c *PanelClient) SignIn(token string) int {
	code, body := c.Do("POST", "/ui/session", `{"token":"`+token+`"}`, map[string]string{"Content-Type": "application/json"})
	if code == 200 {
		var s struct{ CSRF string }
		require.NoError(c.t, json.Unmarshal([]byte(body), &s))
		c.CSRF = s.CSRF
	}
	return code
}
