// Package dbfault is a TCP proxy in front of Postgres that fails its connections on demand: cut
// (as if the server restarted or went away), losing Postgres's answers, or partitioned (nothing
// passes and neither side hears of it); for the fault tests and the soak of the load tool.
package dbfault

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
)

// Proxy is a TCP proxy in front of the test database that a test cuts, as if Postgres
// restarted or went away, or partitions, and restores.
type Proxy struct {
	ln             net.Listener
	network, addr  string
	mu             sync.Mutex
	down           bool // Cut: connections refused
	dropAnswers    bool // DropAnswers: what Postgres sends is lost
	partitioned    bool // Partition: what either side sends is lost; new connections hang
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
		switch {
		case p.down:
			p.mu.Unlock()
			_ = c.Close() // refused: the server is away
			continue
		case p.partitioned:
			p.conns[c] = struct{}{} // held, never answered, until Cut or Close
			p.mu.Unlock()
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
		go p.pipe(c, up, true)
		go p.pipe(up, c, false)
	}
}

// pipe copies what src sends to dst, dropping what the proxy's state says is lost; answers tells
// that src is Postgres.
func (p *Proxy) pipe(dst, src net.Conn, answers bool) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && p.passes(answers) {
			if _, err := dst.Write(buf[:n]); err != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	if !p.passes(answers) {
		// Partitioned: the other side never hears that src closed; dst stays open until Cut.
		p.mu.Lock()
		delete(p.conns, src)
		p.mu.Unlock()
		_ = src.Close()
		return
	}
	_ = dst.Close()
	_ = src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

func (p *Proxy) passes(answer bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.partitioned && !(answer && p.dropAnswers)
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

// DropAnswers loses what Postgres sends from now on, while what the clients send still reaches
// it: statements run and commit, and their clients never hear of it. Cut the connections before
// Restore (they lost bytes).
func (p *Proxy) DropAnswers() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropAnswers = true
}

// Partition loses what either side sends from now on and leaves every connection open, as a
// network that went away without a word to either side: Postgres keeps the sessions (and their
// transactions) of clients that are gone, and new connections hang. Cut the connections before
// Restore (they lost bytes).
func (p *Proxy) Partition() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.partitioned = true
}

// Restore lets connections and bytes through again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down, p.dropAnswers, p.partitioned = false, false, false
}

// Close stops the proxy and drops its connections.
func (p *Proxy) Close() {
	p.closeListening.Do(func() { _ = p.ln.Close() })
	p.Cut()
	p.wg.Wait()
}
