package db

import (
	"context"
	"net"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// keepAlive is how wsproxy's connections to Postgres probe a silent peer: after 15 s of silence,
// every 5 s, 3 times, so that a connection whose peer went away without a word (a network
// partition, a host that died) fails within about 30 s — an idle pooled connection before a
// request waits on it, the LISTEN connection before it misses a day of notifications — instead
// of the 2.5 minutes of Go's defaults (15 s, every 15 s, the system's 9 times). Postgres's side of
// a transaction left open is ended by IdleTimeout.
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second, Interval: 5 * time.Second, Count: 3}

// dial connects to Postgres with keepAlive.
func dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{KeepAliveConfig: keepAlive}
	return d.DialContext(ctx, network, addr)
}

// ConfigurePool readies the config of wsproxy's pool: TCP keepalives on its connections, and
// timeout as their statement_timeout unless the URL sets one.
func ConfigurePool(cfg *pgxpool.Config, timeout time.Duration) {
	cfg.ConnConfig.DialFunc = dial
	if _, set := cfg.ConnConfig.RuntimeParams["statement_timeout"]; !set {
		cfg.ConnConfig.RuntimeParams["statement_timeout"] = strconv.FormatInt(timeout.Milliseconds(), 10)
	}
}
