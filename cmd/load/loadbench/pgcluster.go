package loadbench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgEnv runs PostgreSQL's server binaries for the clusters of a failover run, all in one work
// folder: as the postgres user when run as root (PostgreSQL refuses root), loopback TCP only.
type pgEnv struct {
	bin   string // the folder of initdb, pg_ctl, pg_basebackup
	owner string // the user the clusters run as ("" is this process's)
	dir   string // the work folder: each cluster's data and log, the sockets
}

func newPGEnv(dir string) (*pgEnv, error) {
	e := &pgEnv{dir: dir}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if b := strings.TrimSpace(string(out)); fileExists(filepath.Join(b, "initdb")) {
			e.bin = b
		}
	}
	if e.bin == "" {
		dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
		sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
		for _, d := range dirs {
			if fileExists(filepath.Join(d, "initdb")) {
				e.bin = d
				break
			}
		}
	}
	if e.bin == "" {
		return nil, errors.New("no PostgreSQL server binaries found (initdb, pg_ctl, pg_basebackup; Debian/Ubuntu: apt-get install postgresql)")
	}
	if os.Geteuid() == 0 {
		if _, err := user.Lookup("postgres"); err != nil {
			return nil, errors.New("as root the clusters run as the postgres user, and there is none")
		}
		e.owner = "postgres"
	}
	if err := e.mkdir(dir); err != nil {
		return nil, err
	}
	return e, nil
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// versionOf is the major version in a path like /usr/lib/postgresql/15/bin.
func versionOf(p string) int { n, _ := strconv.Atoi(filepath.Base(filepath.Dir(p))); return n }

// mkdir makes a folder the clusters' owner owns.
func (e *pgEnv) mkdir(d string) error {
	if err := os.MkdirAll(d, 0o755); err != nil {
		return err
	}
	if e.owner != "" {
		return exec.Command("chown", e.owner, d).Run()
	}
	return nil
}

// run runs one of the server binaries as the clusters' owner.
func (e *pgEnv) run(name string, args ...string) error {
	cmd := exec.Command(filepath.Join(e.bin, name), args...)
	if e.owner != "" {
		cmd = exec.Command("runuser", append([]string{"-u", e.owner, "--", filepath.Join(e.bin, name)}, args...)...)
	}
	cmd.Dir = "/"
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// pgCluster is one cluster of a failover run, on 127.0.0.1:port.
type pgCluster struct {
	env  *pgEnv
	name string
	port int
}

func (c *pgCluster) data() string { return filepath.Join(c.env.dir, c.name) }

// url is a connection to this cluster alone.
func (c *pgCluster) url() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// initPrimary creates the cluster (trust on loopback, as initdb --auth=trust writes it, for
// replication too).
func (c *pgCluster) initPrimary() error {
	return c.env.run("initdb", "-D", c.data(), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C")
}

// initStandby makes the cluster a streaming standby of primary (pg_basebackup -R); a setting of
// synchronous standbys copied from the primary is dropped, so that once promoted it does not
// wait for a standby it does not have yet (the run sets it again once one streams).
func (c *pgCluster) initStandby(primary *pgCluster) error {
	_ = os.RemoveAll(c.data())
	if err := c.env.run("pg_basebackup", "-D", c.data(), "-R", "-X", "stream", "-c", "fast",
		"-h", "127.0.0.1", "-p", strconv.Itoa(primary.port), "-U", "postgres"); err != nil {
		return err
	}
	auto := filepath.Join(c.data(), "postgresql.auto.conf")
	b, err := os.ReadFile(auto)
	if err != nil {
		return err
	}
	var keep []string
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "synchronous_standby_names") {
			keep = append(keep, line)
		}
	}
	return os.WriteFile(auto, []byte(strings.Join(keep, "\n")), 0o600)
}

// start starts the cluster on its port. fsync is off (the run crashes Postgres's processes, not
// the machine: what a process wrote survives it), the WAL kept for a standby rebuilt from it.
func (c *pgCluster) start() error {
	opts := fmt.Sprintf("-c port=%d -c listen_addresses=127.0.0.1 -c unix_socket_directories=%s -c max_connections=200 "+
		"-c fsync=off -c full_page_writes=off -c wal_keep_size=256MB -c shared_buffers=32MB", c.port, c.env.dir)
	return c.env.run("pg_ctl", "-D", c.data(), "-w", "-t", "120", "-l", c.data()+".log", "-o", opts, "start")
}

// stop stops the cluster: "immediate" is a crash (no checkpoint, every process killed).
func (c *pgCluster) stop(mode string) error {
	return c.env.run("pg_ctl", "-D", c.data(), "-m", mode, "-w", "-t", "60", "stop")
}

func (c *pgCluster) promote() error {
	return c.env.run("pg_ctl", "-D", c.data(), "-w", "-t", "60", "promote")
}

// running reports whether the cluster's postmaster runs.
func (c *pgCluster) running() bool { return c.env.run("pg_ctl", "-D", c.data(), "status") == nil }

// exec runs statements on the cluster.
func (c *pgCluster) exec(ctx context.Context, sql ...string) error {
	conn, err := pgx.Connect(ctx, c.url())
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, s := range sql {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

// setSynchronous names every standby synchronous (synchronous_standby_names = '*') or none.
func (c *pgCluster) setSynchronous(ctx context.Context, on bool) error {
	set := "ALTER SYSTEM RESET synchronous_standby_names"
	if on {
		set = "ALTER SYSTEM SET synchronous_standby_names = '*'"
	}
	return c.exec(ctx, set, "SELECT pg_reload_conf()")
}

// waitStandby waits until a standby streams from the cluster (as a synchronous one, with sync).
func (c *pgCluster) waitStandby(ctx context.Context, sync bool) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var n int
		conn, err := pgx.Connect(ctx, c.url())
		if err == nil {
			err = conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND ($1 = false OR sync_state = 'sync')`, sync).Scan(&n)
			conn.Close(ctx)
		}
		if err == nil && n > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no standby streams from %s after 2 minutes (%v)", c.name, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// walSender is the process id of the primary's WAL sender (of its one standby).
func (c *pgCluster) walSender(ctx context.Context) (int, error) {
	conn, err := pgx.Connect(ctx, c.url())
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var pid int
	if err := conn.QueryRow(ctx, "SELECT pid FROM pg_stat_replication LIMIT 1").Scan(&pid); err != nil {
		return 0, fmt.Errorf("the WAL sender of %s: %w", c.name, err)
	}
	return pid, nil
}

// crash stops the cluster hard (pg_ctl stop -m immediate). A WAL sender held (sender, stopped
// with SIGSTOP) is killed once the stop is under way, never let go: let go, it would send what
// it held back before the postmaster's SIGQUIT reached it. So the standby is as far behind as a
// standby whose primary's host died.
func (c *pgCluster) crash(sender int) error {
	if sender == 0 {
		return c.stop("immediate")
	}
	err := c.env.run("pg_ctl", "-D", c.data(), "-m", "immediate", "-W", "stop")
	_ = syscall.Kill(sender, syscall.SIGKILL)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(time.Minute)
	for c.running() {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s still running a minute after its immediate stop", c.name)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// behind says how far the standby is behind the primary's WAL.
func (c *pgCluster) behind(ctx context.Context) string {
	conn, err := pgx.Connect(ctx, c.url())
	if err != nil {
		return err.Error()
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var sent, flushed, current int64
	err = conn.QueryRow(ctx, `SELECT pg_current_wal_lsn() - sent_lsn, pg_current_wal_lsn() - flush_lsn, pg_current_wal_lsn() - '0/0' FROM pg_stat_replication LIMIT 1`).Scan(&sent, &flushed, &current)
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("the standby is %d bytes of WAL behind what was sent, %d behind what it flushed", sent, flushed)
}
