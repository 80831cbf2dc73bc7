package dbtest

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wsproxy/wsproxy/db"
)

// FaultProxy is a TCP proxy in front of the test database that a test cuts, as if Postgres
// restarted or went away, and restores.
type FaultProxy struct {
	ln             net.Listener
	network, addr  string
	mu             sync.Mutex
	down           bool
	conns          map[net.Conn]struct{}
	wg             sync.WaitGroup
	closeListening sync.Once
}

// NewFaultProxy listens on a loopback port and forwards to the Postgres at host (a host name, or
// a socket folder when it starts with /) and port.
func NewFaultProxy(host string, port uint16) (*FaultProxy, error) {
	p := &FaultProxy{conns: map[net.Conn]struct{}{}}
	if strings.HasPrefix(host, "/") {
		p.network, p.addr = "unix", fmt.Sprintf("%s/.s.PGSQL.%d", host, port)
	} else {
		p.network, p.addr = "tcp", net.JoinHostPort(host, strconv.Itoa(int(port)))
	}
	var err error
	if p.ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		return nil, fmt.Errorf("fault proxy: %w", err)
	}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Port is the loopback port the proxy listens on.
func (p *FaultProxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// NewFaultPool returns a pool on a fresh, migrated schema whose connections go through a
// FaultProxy. Both are closed when the test ends.
func NewFaultPool(t testing.TB, configure func(*pgxpool.Config)) (*pgxpool.Pool, *FaultProxy) {
	t.Helper()
	_, cfg := Schema(t)
	p, err := NewFaultProxy(cfg.ConnConfig.Host, cfg.ConnConfig.Port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)

	cfg.ConnConfig.Host = "127.0.0.1"
	cfg.ConnConfig.Port = uint16(p.Port())
	cfg.ConnConfig.Fallbacks = nil
	cfg.ConnConfig.TLSConfig = nil
	if configure != nil {
		configure(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("connect through the fault proxy: %v", err)
	}
	t.Cleanup(pool.Close)
	if err := db.Migrate(context.Background(), pool); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return pool, p
}

func (p *FaultProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.down {
			p.mu.Unlock()
			_ = c.Close() // refused: the server is away
			continue
		}
		up, err := net.Dial(p.network, p.addr)
		if err != nil {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

func (p *FaultProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
	_ = src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// Cut drops every open connection and refuses new ones until Restore.
func (p *FaultProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		_ = c.Close()
	}
}

// Restore lets connections through again.
func (p *FaultProxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

// Close stops the proxy and drops its connections.
func (p *FaultProxy) Close() {
	p.closeListening.Do(func() { _ = p.ln.Close() })
	p.Cut()
	p.wg.Wait()
}
