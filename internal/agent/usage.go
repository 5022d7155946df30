package agent

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/prometheus/procfs"
)

// SessionUsage is what one xrdp session's processes use.
type SessionUsage struct {
	User      string // user name (uid when it has no name)
	Display   string // N of :N
	PSSBytes  uint64 // sum of Pss over the session's processes, from /proc/PID/smaps_rollup
	CPUTicks  uint64 // cumulative utime+stime (clock ticks, /proc/PID/stat fields 14,15) of the session's processes
	Processes int
}

// ReadSessionUsage reads every xrdp session's usage from /proc under root.
//
// A session's processes are its user's processes that descend from the
// xrdp-sesman process that started its X server: xrdp-sesman forks one
// such process per session, which starts the X server, the window
// manager script and xrdp-chansrv, and what the user runs descends from
// these. The user's processes outside any session are not counted, nor
// is one that left the tree (a daemon that forked twice and was adopted
// by init). Pss divides each shared page among the processes mapping it,
// so sessions sharing libraries add up to the memory they hold, where
// resident sizes would count the libraries once per session.
//
// Processes that end while they are read are skipped. An error means
// /proc could not be read at all, or a process's memory could not be read
// for want of privilege (the agent needs CAP_SYS_PTRACE for other users'
// smaps_rollup).
func ReadSessionUsage(root string) ([]SessionUsage, error) {
	sessions, err := scanXRDP(root)
	if err != nil || len(sessions) == 0 {
		return nil, err
	}
	t, err := readTree(root)
	if err != nil {
		return nil, err
	}
	out := make([]SessionUsage, 0, len(sessions))
	for _, s := range sessions {
		u := SessionUsage{User: s.user, Display: s.display}
		for _, pid := range t.descendants(s.sesman) {
			if t.uid[pid] != s.uid {
				continue
			}
			p, ok, err := readProcUsage(root, pid)
			if err != nil {
				return nil, err
			}
			if !ok {
				continue
			}
			u.PSSBytes += p.pss
			u.CPUTicks += p.ticks
			u.Processes++
		}
		out = append(out, u)
	}
	return out, nil
}

// procTree is the parent-child relation of the processes under a /proc,
// with their owners, as read one process at a time: a process that starts
// during the reading may be missing, one that ends may still be there.
type procTree struct {
	children map[int][]int
	uid      map[int]string
}

// readTree reads the PPid and Uid of every process under root.
func readTree(root string) (procTree, error) {
	ents, err := os.ReadDir(root)
	if err != nil {
		return procTree{}, fmt.Errorf("agent: %w", err)
	}
	t := procTree{children: map[int][]int{}, uid: map[int]string{}}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		status, err := os.ReadFile(filepath.Join(root, e.Name(), "status"))
		if err != nil {
			continue // ended since the listing
		}
		ppid, err := strconv.Atoi(statusField(status, "PPid:"))
		if err != nil {
			continue
		}
		t.children[ppid] = append(t.children[ppid], pid)
		t.uid[pid] = statusField(status, "Uid:")
	}
	return t, nil
}

// descendants lists the processes below pid, not pid itself. A pid is
// visited once: with pids reused while the tree was read, the relation
// could otherwise hold a loop.
func (t procTree) descendants(pid int) []int {
	var out []int
	seen := map[int]bool{pid: true}
	next := []int{pid}
	for len(next) > 0 {
		p := next[len(next)-1]
		next = next[:len(next)-1]
		for _, c := range t.children[p] {
			if !seen[c] {
				seen[c] = true
				out = append(out, c)
				next = append(next, c)
			}
		}
	}
	return out
}

// procUsage is one process's share of a session's usage.
type procUsage struct {
	pss   uint64 // bytes
	ticks uint64
}

// readProcUsage reads one process's CPU time and Pss; ok is false when
// the process has ended (gone, or a zombie whose parent has yet to
// collect it).
func readProcUsage(root string, pid int) (u procUsage, ok bool, err error) {
	st, err := procStat(root, pid)
	if err != nil {
		return u, false, ignoreEnded(err)
	}
	if st.State == "Z" || st.State == "X" {
		return u, false, nil
	}
	dir := filepath.Join(root, strconv.Itoa(pid))
	rollup, err := os.ReadFile(filepath.Join(dir, "smaps_rollup"))
	if err != nil {
		return u, false, ignoreEnded(err)
	}
	return procUsage{pss: parsePss(rollup), ticks: uint64(st.UTime + st.STime)}, true, nil
}

// ignoreEnded drops the errors of reading a process that has ended:
// its directory is gone, or the kernel finds no process behind it.
func ignoreEnded(err error) error {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return fmt.Errorf("agent: %w", err)
}

// procStat reads /proc/PID/stat below root (the real /proc, or a test's).
func procStat(root string, pid int) (procfs.ProcStat, error) {
	fs, err := procfs.NewFS(root)
	if err != nil {
		return procfs.ProcStat{}, err
	}
	p, err := fs.Proc(pid)
	if err != nil {
		return procfs.ProcStat{}, err
	}
	st, err := p.Stat()
	if err != nil {
		return st, fmt.Errorf("%s/%d/stat: %w", root, pid, err)
	}
	return st, nil
}

// parsePss returns the Pss line of a smaps_rollup in bytes; a process
// without memory (one ending as it is read) has none and reads as 0.
func parsePss(b []byte) uint64 {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "Pss:" {
			kb, _ := strconv.ParseUint(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// userHZ is the unit of the times in /proc/PID/stat: USER_HZ, which the
// kernel fixes at 100 for user space whatever its own tick rate.
const userHZ = 100

// cpuMeter turns sessions' cumulative CPU ticks into the share of one core
// each used since the previous reading. Only the agent's heartbeat loop
// uses it.
type cpuMeter struct {
	at    time.Time
	ticks map[string]uint64 // by user and display
}

// annotate returns ss with each session's memory and CPU from usage,
// read at now. A user with several sessions is given their sum, as the
// broker knows one session per user and host. A session seen for the
// first time has used no CPU yet; so has one whose ticks went down (it
// ended and another took its display, or its processes ended and their
// time went with them).
func (m *cpuMeter) annotate(ss []brokerapi.Session, usage []SessionUsage, now time.Time) []brokerapi.Session {
	secs := now.Sub(m.at).Seconds()
	type sum struct {
		mem uint64
		cpu float64
	}
	byUser := map[string]sum{}
	ticks := make(map[string]uint64, len(usage))
	for _, u := range usage {
		key := u.User + "\x00" + u.Display
		ticks[key] = u.CPUTicks
		s := byUser[u.User]
		s.mem += u.PSSBytes
		if prev, ok := m.ticks[key]; ok && secs > 0 && u.CPUTicks >= prev {
			s.cpu += float64(u.CPUTicks-prev) / userHZ / secs
		}
		byUser[u.User] = s
	}
	m.at, m.ticks = now, ticks
	out := make([]brokerapi.Session, len(ss))
	for i, s := range ss {
		u := byUser[s.User]
		s.MemoryBytes, s.CPU = u.mem, u.cpu
		out[i] = s
	}
	return out
}
