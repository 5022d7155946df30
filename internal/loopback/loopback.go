// Package loopback finds free loopback ports and waits for a server
// started on one; tests, benches and the PostgreSQL cluster helper share it.
package loopback

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// reserveFor is how long a port handed out stays reserved for whoever
// got it, machine-wide: between our check and the server's bind another
// process (a test package running beside, a bench's second server) could
// draw the same free port, and clean-clone runs did. A server binds within
// seconds; a reservation lasts one to two of these periods.
const reserveFor = 10 * time.Minute

// reserveDir holds one directory per reservation period, named by its
// number, with an empty file per port handed out in it. It is under /tmp
// rather than $TMPDIR: benches run with a TMPDIR of their own, and every
// process on the machine must see the same reservations.
func reserveDir() string { return "/tmp/deskway-loopback-ports" }

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago and
// that no other caller on this machine was given in the last ten minutes.
// It is drawn below Linux's ephemeral range (32768 and up by default),
// where the kernel picks the local ports of outgoing connections: a port
// from there can be taken by any connection before the server binds it.
func FreePort() (int, error) {
	ports, err := FreePorts(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// FreePorts returns n different ports as FreePort does.
func FreePorts(n int) ([]int, error) {
	var held []net.Listener
	defer func() {
		for _, ln := range held {
			ln.Close()
		}
	}()
	res := newReservations(reserveDir(), time.Now())
	ports := make([]int, 0, n)
	for try := 0; len(ports) < n && try < 200*n; try++ {
		port := 20000 + rand.IntN(12000)
		if !res.claim(port) {
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		held = append(held, ln)
		ports = append(ports, port)
	}
	if len(ports) < n {
		return nil, errors.New("loopback: no free port between 20000 and 32000 on 127.0.0.1")
	}
	return ports, nil
}

// reservations claims ports in this period's directory after checking the
// previous period's, so a port stays reserved for at least reserveFor.
// Where the directory cannot be written every claim succeeds: the bind
// check alone is what FreePort did before.
type reservations struct {
	dir, cur, prev string
	ok             bool
}

func newReservations(dir string, now time.Time) reservations {
	period := now.Unix() / int64(reserveFor/time.Second)
	r := reservations{
		dir:  dir,
		cur:  filepath.Join(dir, strconv.FormatInt(period, 10)),
		prev: filepath.Join(dir, strconv.FormatInt(period-1, 10)),
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return r
	}
	// Every user of the machine shares the reservations, as they share
	// the ports.
	_ = os.Chmod(dir, 0o1777)
	if err := os.Mkdir(r.cur, 0o777); err != nil && !errors.Is(err, os.ErrExist) {
		return r
	}
	_ = os.Chmod(r.cur, 0o1777)
	r.ok = true
	r.dropOld(period)
	return r
}

// dropOld removes the directories of periods before the previous one.
func (r reservations) dropOld(period int64) {
	entries, err := os.ReadDir(r.dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if p, err := strconv.ParseInt(e.Name(), 10, 64); err == nil && p < period-1 {
			_ = os.RemoveAll(filepath.Join(r.dir, e.Name()))
		}
	}
}

// claim reports whether port was not handed out in this period or the
// previous one, and reserves it when so. Creating the file exclusively
// makes the claim atomic between processes.
func (r reservations) claim(port int) bool {
	if !r.ok {
		return true
	}
	name := strconv.Itoa(port)
	if _, err := os.Stat(filepath.Join(r.prev, name)); err == nil {
		return false
	}
	f, err := os.OpenFile(filepath.Join(r.cur, name), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return false
	}
	f.Close()
	return true
}

// WaitPort waits up to d for addr to accept a connection.
func WaitPort(addr string, d time.Duration) error {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("loopback: %s did not open within %s", addr, d)
}
