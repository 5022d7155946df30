package pgcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/procfs"
)

// Stall freezes the server for d, as a machine stuck on its disk or a
// link that drops packets without a word would: every server process is
// stopped (SIGSTOP), so statements sent meanwhile neither fail nor
// answer, new connections wait unanswered, and both go on, late, when it
// resumes (SIGCONT). It returns when the server runs again, or when ctx
// ends (the server resumes then too).
func (c *Cluster) Stall(ctx context.Context, d time.Duration) error {
	pids, err := c.serverPIDs()
	if err != nil {
		return err
	}
	for _, p := range pids {
		_ = syscall.Kill(p, syscall.SIGSTOP)
	}
	defer func() {
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGCONT)
		}
	}()
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
	return nil
}

// serverPIDs are the postmaster's process id, from its pid file, and its
// children's.
func (c *Cluster) serverPIDs() ([]int, error) {
	b, err := os.ReadFile(filepath.Join(c.data, "postmaster.pid"))
	if err != nil {
		return nil, fmt.Errorf("pgcluster: the server is not running: %w", err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pm, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return nil, fmt.Errorf("pgcluster: postmaster.pid: %w", err)
	}
	procs, err := procfs.AllProcs()
	if err != nil {
		return nil, fmt.Errorf("pgcluster: list processes: %w", err)
	}
	pids := []int{pm}
	for _, p := range procs {
		if st, err := p.Stat(); err == nil && st.PPID == pm { // err: ended meanwhile
			pids = append(pids, p.PID)
		}
	}
	return pids, nil
}
