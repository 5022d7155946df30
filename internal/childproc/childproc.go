// Package childproc starts the programs tests and benches run beside
// deskway (xrdp, Xvfb, clients, deskway's own roles) each in its own
// process group, keeps what they print for error messages, and stops them
// with everything they started.
package childproc

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Proc is a started program.
type Proc struct {
	Cmd  *exec.Cmd
	out  *lockedBuffer
	done chan struct{}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Start runs name with args in a process group of its own, with env
// added to this process's environment.
func Start(env []string, name string, args ...string) (*Proc, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc{Cmd: cmd, out: out, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

// Exited is closed once the program has ended and was collected.
func (p *Proc) Exited() <-chan struct{} { return p.done }

// Pid is the program's process id.
func (p *Proc) Pid() int { return p.Cmd.Process.Pid }

// Stop ends the program's process group: SIGTERM, then SIGKILL for a
// group still there after five seconds. It returns once the program was
// collected.
func (p *Proc) Stop() { p.StopWithin(5 * time.Second) }

// StopWithin is Stop with grace in place of five seconds, for a server
// that may take longer to finish what it holds. A program already
// collected is not signalled again: its process group id may be reused.
func (p *Proc) StopWithin(grace time.Duration) {
	if !p.running() {
		return
	}
	_ = syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.Kill()
	}
}

// Kill ends the program's process group with SIGKILL at once, as a crash
// would, and returns once the program was collected.
func (p *Proc) Kill() {
	if !p.running() {
		return
	}
	_ = syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// running reports whether there is a program not yet collected to signal.
func (p *Proc) running() bool {
	if p == nil || p.Cmd.Process == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Output is everything the program printed so far.
func (p *Proc) Output() string { return p.out.String() }

// Tail is the last n lines the program printed, for an error message.
func (p *Proc) Tail(n int) string {
	lines := strings.Split(strings.TrimSpace(p.out.String()), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// RemoveStaleX deletes the socket and lock file of every X display from
// first to last whose server is gone. A server killed with SIGKILL
// leaves both behind, and xrdp-sesman and Xvfb take such a display as
// busy: after as many killed sessions as sesman has displays, it
// refuses every login ("no display in range is available").
func RemoveStaleX(first, last int) {
	removeX(first, last, func(lock, _ string) bool {
		b, err := os.ReadFile(lock)
		if err != nil {
			return !os.IsNotExist(err) // unreadable: leave it be
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && pid > 0 && syscall.Kill(pid, 0) == nil
	})
}

// RemoveUnansweringX is RemoveStaleX for displays whose servers ran in
// another PID namespace, whose lock files name pids of that namespace:
// a display is alive while its socket takes connections.
func RemoveUnansweringX(first, last int) {
	removeX(first, last, func(_, sock string) bool {
		c, err := net.DialTimeout("unix", sock, time.Second)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
}

func removeX(first, last int, alive func(lock, sock string) bool) {
	for n := first; n <= last; n++ {
		lock := fmt.Sprintf("/tmp/.X%d-lock", n)
		sock := fmt.Sprintf("/tmp/.X11-unix/X%d", n)
		if alive(lock, sock) {
			continue
		}
		_ = os.Remove(lock)
		_ = os.Remove(sock)
	}
}

// PrepareXRDPSocketDir makes dir (xrdp's /var/run/xrdp/sockdir) as
// xrdp-sesman would, world-writable and sticky, whatever the umask: the
// session's X server runs as the user and binds its socket there, and in
// a directory made with the umask's 0755 every logon hangs with no frame
// (xorgxrdp logs "g_tcp_local_bind failed").
func PrepareXRDPSocketDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("xrdp socket directory: %w", err)
	}
	if err := os.Chmod(dir, 0o777|os.ModeSticky); err != nil {
		return fmt.Errorf("xrdp socket directory: %w", err)
	}
	return nil
}

// StartXvfb starts an X server for clients to draw into, on the first
// free display from :150, and returns it with its display (":150").
func StartXvfb() (*Proc, string, error) {
	for n := 150; n < 200; n++ {
		if _, err := os.Stat(fmt.Sprintf("/tmp/.X11-unix/X%d", n)); err == nil {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/tmp/.X%d-lock", n)); err == nil {
			continue
		}
		p, err := Start(nil, "Xvfb", fmt.Sprintf(":%d", n), "-screen", "0", "1920x1080x24", "-nolisten", "tcp")
		if err != nil {
			return nil, "", err
		}
		for i := 0; i < 100; i++ {
			if _, err := os.Stat(fmt.Sprintf("/tmp/.X11-unix/X%d", n)); err == nil {
				return p, fmt.Sprintf(":%d", n), nil
			}
			time.Sleep(50 * time.Millisecond)
		}
		p.Stop()
		return nil, "", fmt.Errorf("Xvfb :%d did not start: %s", n, p.Tail(5))
	}
	return nil, "", fmt.Errorf("no free X display from :150 to :199")
}

// CertSHA256 is the SHA-256 of the DER certificate in the PEM file at
// path, in hex: what a gateway resource policy pins a host's
// certificate with.
func CertSHA256(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return "", fmt.Errorf("%s holds no PEM block", path)
	}
	if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	sum := sha256.Sum256(blk.Bytes)
	return hex.EncodeToString(sum[:]), nil
}
