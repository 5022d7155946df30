package gateway_test

import (
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// waitLogged waits until the gateways hs have logged what at least n
// times in all, or fails after d. A tunnel's closing line, with its
// reason, comes after the tunnel leaves the admin API's list, so a test
// that saw the list empty waits for the line.
func waitLogged(t *testing.T, what string, n int, d time.Duration, hs ...*harness) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		got := 0
		for _, h := range hs {
			got += strings.Count(h.logs.String(), what)
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q logged %d times in %s, want %d", what, got, d, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitStalled waits until the client's sending of total bytes has
// stalled: the one tunnel the admin API at url lists has relayed bytes to
// the host and no more for three polls, and either all total of them or
// bytes are held on the way: the gateway leaves bytes its client sent
// unread (in its socket, or not yet sent from the client's), or it has
// read the last of them and cannot write them to the host (its socket to
// the host has bytes unsent: a relay read all 64 KiB the client had
// left in one CI run). It fails after 10 s.
func waitStalled(t *testing.T, h *harness, url string, total uint64) {
	t.Helper()
	gw := portOf(t, h.addr)
	deadline := time.Now().Add(10 * time.Second)
	var last uint64
	for still := 0; ; time.Sleep(100 * time.Millisecond) {
		list := tunnels(t, url)
		if len(list) != 1 {
			t.Fatalf("waiting for the tunnel to fill its host: %d tunnels listed, want 1", len(list))
		}
		if up := list[0].BytesUp; up > 0 && up == last {
			still++
		} else {
			still, last = 0, up
		}
		backedUp := false
		for _, s := range tcpSocks(t) {
			// The client's bytes wait in its socket or the gateway's, or
			// the relay has read them all and waits to write to the host.
			if s.established && (s.remotePort == gw && s.unsent > 0 || s.localPort == gw && s.unread > 0 ||
				s.remotePort == int(h.echoPort) && s.unsent > 0) {
				backedUp = true
			}
		}
		if still >= 3 && (backedUp || last == total) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s, the tunnel has relayed %d bytes up, the same for the last %d polls; the client's bytes backed up: %v", last, still, backedUp)
		}
	}
}

// isTimeout reports whether err is a deadline that passed.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// tcpSock is an IPv4 TCP socket of this machine, from /proc/net/tcp.
type tcpSock struct {
	localPort, remotePort int
	established           bool
	unsent, unread        int // bytes in the send and receive queues
}

// tcpSocks lists this machine's IPv4 TCP sockets.
func tcpSocks(t *testing.T) []tcpSock {
	t.Helper()
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	port := func(addr string) int {
		_, p, _ := strings.Cut(addr, ":")
		n, _ := strconv.ParseInt(p, 16, 32)
		return int(n)
	}
	var out []tcpSock
	for _, line := range strings.Split(string(b), "\n")[1:] {
		// sl local_address rem_address st tx_queue:rx_queue ...
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		tx, rx, _ := strings.Cut(f[4], ":")
		unsent, _ := strconv.ParseInt(tx, 16, 64)
		unread, _ := strconv.ParseInt(rx, 16, 64)
		out = append(out, tcpSock{port(f[1]), port(f[2]), f[3] == "01", int(unsent), int(unread)})
	}
	return out
}

// portOf is the port of a host:port address.
func portOf(t *testing.T, addr string) int {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// waitDrained waits until the gateway listening at addr (IPv4) holds at
// least n established connections and has read every byte its clients
// sent: none has unread bytes in its kernel receive queue. It fails
// after 10 s.
func waitDrained(t *testing.T, addr string, n int) {
	t.Helper()
	gw := portOf(t, addr)
	deadline := time.Now().Add(10 * time.Second)
	for {
		conns, unread := 0, 0
		for _, s := range tcpSocks(t) {
			if s.localPort == gw && s.established {
				conns++
				if s.unread > 0 {
					unread++
				}
			}
		}
		if conns >= n && unread == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s, %d connections to the gateway (want %d), %d holding bytes it has not read", conns, n, unread)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
