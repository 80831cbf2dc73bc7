// Package dbfault is a TCP proxy in front of Postgres that cuts its connections on demand, as
// if the server restarted or went away: for the fault tests and the soak of the load tool.
package dbfault

import (
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
)

// Proxy is a TCP proxy in front of the test database that a test cuts, as if Postgres
// restarted or went away, and restores.
type Proxy struct {
	ln             net.Listener
	network, addr  string
	mu             sync.Mutex
	down           bool
	conns          map[net.Conn]struct{}
	wg             sync.WaitGroup
	closeListening sync.Once
}

// New listens on a loopback port and forwards to the Postgres at host (a host name, or
// a socket folder when it starts with /) and port.
func New(host string, port uint16) (*Proxy, error) {
	p := &Proxy{conns: map[net.Conn]struct{}{}}
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
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

func (p *Proxy) accept() {
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

func (p *Proxy) pipe(dst, src net.Conn) {
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
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		_ = c.Close()
	}
}

// Restore lets connections through again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

// Close stops the proxy and drops its connections.
func (p *Proxy) Close() {
	p.closeListening.Do(func() { _ = p.ln.Close() })
	p.Cut()
	p.wg.Wait()
}
