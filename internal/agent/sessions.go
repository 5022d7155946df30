package agent

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/deskway/deskway/internal/broker/brokerapi"
)

// XRDPSessions finds xrdp sessions from /proc under root: every X server
// (Xorg or Xvnc) started by xrdp-sesman is one user's session on display
// :N, and it is active while xrdp holds a connection on that display's
// socket (…/xrdp_display_N in /proc/net/unix), disconnected otherwise.
// xrdp records no utmp entries and needs no logind, so this is what tells
// the session state on a plain Debian host.
func XRDPSessions(root string) ([]brokerapi.Session, error) {
	found, err := scanXRDP(root)
	if err != nil {
		return nil, err
	}
	out := make([]brokerapi.Session, 0, len(found))
	for _, s := range found {
		state := "disconnected"
		if s.connected {
			state = "active"
		}
		out = append(out, brokerapi.Session{User: s.user, State: state})
	}
	return out, nil
}

// xrdpSession is one xrdp session as /proc shows it.
type xrdpSession struct {
	user      string
	uid       string
	display   string // N of :N
	xserver   int    // the X server's pid
	sesman    int    // the xrdp-sesman process that started it
	connected bool
}

// scanXRDP lists the xrdp sessions under root, sorted by user.
func scanXRDP(root string) ([]xrdpSession, error) {
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	var out []xrdpSession
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		args, err := os.ReadFile(filepath.Join(root, e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		argv := strings.Split(strings.TrimRight(string(args), "\x00"), "\x00")
		if len(argv) < 2 {
			continue
		}
		prog := filepath.Base(argv[0])
		if prog != "Xorg" && prog != "Xvnc" {
			continue
		}
		status, err := os.ReadFile(filepath.Join(root, e.Name(), "status"))
		if err != nil {
			continue
		}
		ppid, uid := statusField(status, "PPid:"), statusField(status, "Uid:")
		if !isSesman(root, ppid) {
			continue
		}
		sesman, _ := strconv.Atoi(ppid)
		for _, a := range argv[1:] {
			if strings.HasPrefix(a, ":") {
				out = append(out, xrdpSession{uid: uid, display: a[1:], xserver: pid, sesman: sesman})
				break
			}
		}
	}
	unix, err := os.ReadFile(filepath.Join(root, "net", "unix"))
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	connected := connectedXRDPDisplays(unix)
	for i := range out {
		out[i].user = out[i].uid
		if u, err := user.LookupId(out[i].uid); err == nil {
			out[i].user = u.Username
		}
		out[i].connected = connected[out[i].display]
	}
	sort.Slice(out, func(i, j int) bool { return out[i].user < out[j].user })
	return out, nil
}

// isSesman reports whether pid is xrdp's session manager: its executable
// is xrdp-sesman and it runs as root. A process's name and command line
// are its user's to choose; neither is.
func isSesman(root, pid string) bool {
	exe, err := os.Readlink(filepath.Join(root, pid, "exe"))
	// An upgrade leaves running copies on a deleted file.
	if err != nil || filepath.Base(strings.TrimSuffix(exe, " (deleted)")) != "xrdp-sesman" {
		return false
	}
	st, err := os.ReadFile(filepath.Join(root, pid, "status"))
	return err == nil && statusField(st, "Uid:") == "0"
}

// statusField returns the first value of a /proc/PID/status line.
func statusField(status []byte, key string) string {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == key {
			return f[1]
		}
	}
	return ""
}

// connectedXRDPDisplays returns the displays whose xrdp_display_N socket
// has a connected (state 03) entry in /proc/net/unix: xrdp is attached.
func connectedXRDPDisplays(unix []byte) map[string]bool {
	out := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(unix))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 8 || f[5] != "03" {
			continue
		}
		if n, ok := strings.CutPrefix(filepath.Base(f[7]), "xrdp_display_"); ok {
			out[n] = true
		}
	}
	return out
}
