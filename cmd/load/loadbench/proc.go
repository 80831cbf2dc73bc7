package loadbench

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// What the harness reads of Linux's /proc: processes' CPU time and memory, and the machine's
// CPU time.

// cpuTick is the unit of /proc's CPU times (USER_HZ, 100 on Linux).
const cpuTick = 10 * time.Millisecond

// procStat is what /proc/PID/stat says of a process: its parent, its CPU time so far, and that
// of its children it has waited for (those that ended).
type procStat struct {
	ppid          int
	cpu, children time.Duration
}

func readProcStat(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	// Fields after the command name, which is in parentheses and may hold spaces.
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(fields) < 15 {
		return procStat{}, false
	}
	ppid, _ := strconv.Atoi(fields[1])
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	cutime, _ := strconv.ParseInt(fields[13], 10, 64)
	cstime, _ := strconv.ParseInt(fields[14], 10, 64)
	return procStat{ppid: ppid, cpu: time.Duration(utime+stime) * cpuTick, children: time.Duration(cutime+cstime) * cpuTick}, true
}

// currentRSS is a process's resident set size (VmRSS), in bytes.
func currentRSS(pid int) (int64, error) {
	return procStatus(pid, "VmRSS:")
}

// procStatus reads a kB figure of /proc/PID/status.
func procStatus(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

// procCPU is a process's CPU time so far (utime+stime of /proc, in ticks of 10 ms); 0 for pid 0.
func procCPU(pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	st, _ := readProcStat(pid)
	return st.cpu
}

// postgresCPU is the CPU time so far of the Postgres server whose postmaster is pid and of every
// process it started (backends, WAL writer, checkpointer, autovacuum workers, …), those that
// ended too: a backend or an autovacuum worker that ends between two samples counts in its
// postmaster's children's time. 0 for pid 0 (no server).
func postgresCPU(postmaster int) time.Duration {
	if postmaster == 0 {
		return 0
	}
	total := time.Duration(0)
	if st, ok := readProcStat(postmaster); ok {
		total += st.cpu + st.children
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := readProcStat(pid); ok && st.ppid == postmaster {
			total += st.cpu
		}
	}
	return total
}

// ourCPU is the CPU time so far of every process of a row: this one (the clients), the model
// upstream, the row's proxy and Postgres.
func (h *latencyHarness) ourCPU(t target) time.Duration {
	total := postgresCPU(h.postmaster)
	for _, pid := range []int{os.Getpid(), h.modelCmd.Process.Pid, t.pid()} {
		total += procCPU(pid)
	}
	return total
}

// cpuTimes are the machine's CPU times so far, in ticks: all of them, and those not idle.
type cpuTimes struct{ total, busy int64 }

func readCPUTimes() cpuTimes {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal …
	var t cpuTimes
	for i, s := range f[1:] {
		v, _ := strconv.ParseInt(s, 10, 64)
		if i >= 8 { // guest time is counted in user already
			break
		}
		t.total += v
		if i != 3 && i != 4 { // idle, iowait
			t.busy += v
		}
	}
	return t
}
