package auth

import (
	"errors"
	"fmt"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestThrottleBounded: the throttle tracks at most maxTracked addresses however many fail
// within the window, and the addresses of one IPv6 /64 (one host's to pick from) count as one.
func TestThrottleBounded(t *testing.T) {
	t.Parallel()
	g := &Guard{}
	bad := errors.New("bad")
	try := func(addr string) error {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = addr
		return g.Attempt(r, func() bool { return false }, bad)
	}
	for i := range 3 * maxTracked {
		require.ErrorIs(t, try(fmt.Sprintf("10.%d.%d.%d:1234", i>>16&255, i>>8&255, i&255)), bad)
	}
	require.LessOrEqual(t, len(g.failures.failures), maxTracked)

	for i := range MaxFailures {
		require.ErrorIs(t, try(fmt.Sprintf("[2001:db8:1:2::%x]:1234", i+1)), bad)
	}
	err := try("[2001:db8:1:2:ffff::1]:1234")
	require.ErrorContains(t, err, "too many failed authentications", "one /64 is one address")
	require.ErrorIs(t, try("[2001:db8:1:3::1]:1234"), bad, "another /64 is another")
}

// TestNoAdminTokenNoSigner: without an admin token nothing signed is accepted, not even what
// the signer itself made (its key would be derived from nothing, known to anyone).
func TestNoAdminTokenNoSigner(t *testing.T) {
	t.Parallel()
	var v struct{ S string }
	s := (&Guard{}).Signer()
	require.False(t, s.Verify(KindSession, s.Sign(KindSession, map[string]string{"S": "admin"}), &v))
	forged := NewSigner("x") // any key a forger might guess
	require.False(t, s.Verify(KindSession, forged.Sign(KindSession, map[string]string{"S": "admin"}), &v))
	g := &Guard{AdminToken: "t"}
	require.True(t, g.Signer().Verify(KindSession, g.Signer().Sign(KindSession, map[string]string{"S": "admin"}), &v))
	require.Equal(t, "admin", v.S)
}
