package auth

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"
)

// ParseTrustedProxies reads TRUSTED_PROXIES: CIDRs (or single addresses) separated by commas.
func ParseTrustedProxies(spec string) (Peers, error) {
	var out Peers
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if !strings.Contains(item, "/") {
			a, err := netip.ParseAddr(item)
			if err != nil {
				return nil, fmt.Errorf("%q is not an address or a CIDR", item)
			}
			item = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()).String()
		}
		p, err := netip.ParsePrefix(item)
		if err != nil {
			return nil, fmt.Errorf("%q is not an address or a CIDR", item)
		}
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// Peers are the proxies in front of wsproxy whose X-Forwarded-* headers it believes
// (TRUSTED_PROXIES); the zero value believes none.
type Peers []netip.Prefix

// trusted reports whether a is one of the trusted proxies.
func (s Peers) trusted(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range s {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// peer is the request's TCP peer.
func peer(r *http.Request) (netip.Addr, bool) {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	return ap.Addr().Unmap(), err == nil
}

// fromTrustedProxy reports whether the request came from one of TrustedProxies, whose
// X-Forwarded-* headers are then believed.
func (s Peers) fromTrustedProxy(r *http.Request) bool {
	a, ok := peer(r)
	return ok && s.trusted(a)
}

// ClientAddr is the address failed authentication is counted by: the TCP peer's or, from a
// trusted proxy, the client's in X-Forwarded-For — read from the right, the first address that
// is not a trusted proxy's (each proxy appends its own peer; what stands left of that is the
// client's to write). An IPv6 address counts as its /64, which one client holds.
func (s Peers) ClientAddr(r *http.Request) string {
	a, ok := peer(r)
	if !ok {
		return r.RemoteAddr
	}
	if s.trusted(a) {
		hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
		for i := len(hops) - 1; i >= 0; i-- {
			hop := strings.TrimSpace(hops[i])
			if hop == "" {
				continue
			}
			h, err := netip.ParseAddr(hop)
			if err != nil {
				ap, perr := netip.ParseAddrPort(hop)
				if perr != nil {
					return hop // what the trusted proxy wrote, as it wrote it
				}
				h = ap.Addr()
			}
			if a = h.Unmap(); !s.trusted(a) {
				break
			}
		}
	}
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p.String()
	}
	return a.String()
}

// Scheme is the scheme the client reached wsproxy by: https over TLS, or from a trusted proxy
// that says so (X-Forwarded-Proto, the first proxy's).
func (s Peers) Scheme(r *http.Request) string {
	if r.TLS != nil {
		return "https"
	}
	if s.fromTrustedProxy(r) {
		p, _, _ := strings.Cut(r.Header.Get("X-Forwarded-Proto"), ",")
		if p = strings.ToLower(strings.TrimSpace(p)); p == "https" || p == "http" {
			return p
		}
	}
	return "http"
}

// BaseURL is the scheme and host the client reached wsproxy by (a trusted proxy's
// X-Forwarded-Proto and X-Forwarded-Host): where a link points, the panel's origin.
func (s Peers) BaseURL(r *http.Request) string {
	host := r.Host
	if s.fromTrustedProxy(r) {
		if h := r.Header.Get("X-Forwarded-Host"); h != "" && !strings.ContainsAny(h, "/\\@ ,") {
			host = h
		}
	}
	return s.Scheme(r) + "://" + host
}
