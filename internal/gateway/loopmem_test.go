package gateway_test

import (
	"context"
	"net"
	"runtime/pprof"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/tsgclient"
)

// handlerStacks counts goroutines that are inside the gateway's HTTP
// handler.
func handlerStacks(t *testing.T) int {
	t.Helper()
	var b strings.Builder
	if err := pprof.Lookup("goroutine").WriteTo(&b, 2); err != nil {
		t.Fatal(err)
	}
	return strings.Count(b.String(), "gateway.(*Server).ServeHTTP")
}

// TestLoopTunnelsHoldNoGoroutine: a websocket tunnel relayed on an event
// loop keeps no goroutine of its own (net/http's, which ran its handshake,
// with its stack and buffers, was half of a tunnel's memory), and the loop
// still finishes every tunnel: each is logged and leaves the list.
func TestLoopTunnelsHoldNoGoroutine(t *testing.T) {
	loops := 2
	h := start(t, func(c *config.Config) { c.Gateway.RelayLoops = &loops })
	const n = 4
	var conns []*tsgclient.Conn
	for range n {
		cfg := h.cfg("", "", tsgclient.Websocket)
		cfg.Token = h.token(t, "bob", "127.0.0.1", h.echoPort, time.Minute)
		c, err := dial(t, cfg, "127.0.0.1", h.echoPort)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		echoRoundTrip(t, c, 90)
		conns = append(conns, c)
	}
	if got := len(h.srv.Tunnels()); got != n {
		t.Fatalf("%d tunnels listed, want %d", got, n)
	}
	deadline := time.Now().Add(5 * time.Second)
	for handlerStacks(t) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines still in the gateway's handler with %d tunnels open on the loops", handlerStacks(t), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, c := range conns {
		echoRoundTrip(t, c, 1000) // still relayed
		c.Close()
	}
	deadline = time.Now().Add(5 * time.Second)
	for len(h.srv.Tunnels()) > 0 || strings.Count(h.logs.String(), "tunnel closed") < n {
		if time.Now().After(deadline) {
			t.Fatalf("after the clients closed: %d tunnels listed, %d logged closed", len(h.srv.Tunnels()), strings.Count(h.logs.String(), "tunnel closed"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestLoopTunnelsHoldNoReaderBuffer: between messages a tunnel on an
// event loop holds no MS-TSGU reader buffer (it borrows its loop's while
// it drains, as HAProxy holds buffers only while data is in flight), and
// it still relays messages small and large.
func TestLoopTunnelsHoldNoReaderBuffer(t *testing.T) {
	loops := 2
	h := start(t, func(c *config.Config) { c.Gateway.RelayLoops = &loops })
	const n = 4
	for range n {
		cfg := h.cfg("", "", tsgclient.Websocket)
		cfg.Token = h.token(t, "bob", "127.0.0.1", h.echoPort, time.Minute)
		c, err := dial(t, cfg, "127.0.0.1", h.echoPort)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		echoRoundTrip(t, c, 90)
		echoRoundTrip(t, c, 100_000)
		echoRoundTrip(t, c, 90)
	}
	// Each tunnel's last message was drained before its echo came back.
	bufs := h.srv.LoopReaderBuffers()
	if len(bufs) != n {
		t.Fatalf("%d tunnels on the loops, want %d", len(bufs), n)
	}
	for i, c := range bufs {
		if c != 0 {
			t.Fatalf("tunnel %d on a loop holds a %d-byte reader buffer between messages: %v", i, c, bufs)
		}
	}
}

// TestLoopWatchdogChecksTunnelsWithoutATimerEach: tunnels on an event loop
// hold no timer of their own (one each, with a closure and a goroutine
// every check, was about 1 KiB a tunnel); the loop's watchdog checks them
// all, still sends keepalives, and lets go of each tunnel that ends.
func TestLoopWatchdogChecksTunnelsWithoutATimerEach(t *testing.T) {
	loops := 2
	h := start(t, func(c *config.Config) {
		c.Gateway.RelayLoops = &loops
		c.Gateway.Keepalive = config.Duration(200 * time.Millisecond)
	})
	const n = 3
	var conns []*tsgclient.Conn
	var ports []int // the clients' own
	for range n {
		cfg := h.cfg("", "", tsgclient.Websocket)
		cfg.Token = h.token(t, "bob", "127.0.0.1", h.echoPort, time.Minute)
		cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			var d net.Dialer
			conn, err := d.DialContext(ctx, network, addr)
			if err == nil {
				ports = append(ports, conn.LocalAddr().(*net.TCPAddr).Port)
			}
			return conn, err
		}
		c, err := dial(t, cfg, "127.0.0.1", h.echoPort)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		echoRoundTrip(t, c, 90)
		conns = append(conns, c)
	}
	// A tunnel is handed to its loop's watchdog just after the loop
	// starts relaying it.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		timers, watched := h.srv.LoopWatchdogs()
		if timers != 0 {
			t.Fatalf("%d tunnels on the loops hold a timer of their own", timers)
		}
		if watched == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the loops' watchdogs check %d tunnels, want %d", watched, n)
		}
	}
	// Keepalives every 200 ms still reach the silent clients: bytes
	// pile up unread in each one's socket.
	gw := portOf(t, h.addr)
	unread := func() map[int]int {
		m := map[int]int{}
		for _, s := range tcpSocks(t) {
			if s.remotePort == gw && slices.Contains(ports, s.localPort) {
				m[s.localPort] = s.unread
			}
		}
		return m
	}
	first := unread()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		grown := 0
		for p, u := range unread() {
			if u > first[p] {
				grown++
			}
		}
		if grown == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d silent tunnels got a keepalive within 5 s", grown, n)
		}
	}
	for _, c := range conns {
		c.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, watched := h.srv.LoopWatchdogs()
		if watched == 0 && len(h.srv.Tunnels()) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the clients closed the loops' watchdogs still check %d tunnels", watched)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
