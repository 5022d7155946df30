package gateway_test

import (
	"bytes"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/tsgclient"
)

// sink is a host that accepts connections and never reads from them.
func sink(t *testing.T) uint16 {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.(*net.TCPConn).SetReadBuffer(4096)
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	})
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

// source is a host that writes to every connection until it is closed,
// pausing pause between writes.
func source(t *testing.T, pause time.Duration) uint16 {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := bytes.Repeat([]byte("d"), 16<<10)
				for {
					if _, err := c.Write(buf); err != nil {
						return
					}
					time.Sleep(pause)
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

// relayModes are the ways a tunnel is relayed: a websocket on the event
// loops or on goroutines, and the legacy pair (always on goroutines).
var relayModes = []struct {
	name, transport string
	loops           int
}{
	{"websocket-loops", tsgclient.Websocket, 2},
	{"websocket-goroutines", tsgclient.Websocket, 0},
	{"legacy", tsgclient.Legacy, 2},
}

func TestHostThatStopsReadingCannotPinATunnel(t *testing.T) {
	for _, m := range relayModes {
		t.Run(m.name, func(t *testing.T) {
			for _, end := range []string{"admin", "write timeout", "shutdown"} {
				t.Run(end, func(t *testing.T) {
					// Only the write timeout's own case has one short
					// enough to end the tunnel: the others must end it
					// themselves, and take what time they need to set up.
					wt := time.Minute
					if end == "write timeout" {
						wt = 2 * time.Second
					}
					h := start(t, func(c *config.Config) {
						c.Gateway.RelayLoops = &m.loops
						c.Gateway.WriteTimeout = config.Duration(wt)
					})
					url := admin(t, h)
					port := sink(t)
					cfg := h.cfg("", "", m.transport)
					cfg.Token = h.token(t, "bob", "127.0.0.1", port, time.Minute)
					c, err := dial(t, cfg, "127.0.0.1", port)
					if err != nil {
						t.Fatal(err)
					}
					defer c.Close()
					go func() { _, _ = c.Write(make([]byte, 20<<20)) }()
					waitStalled(t, h, url, 20<<20) // the host's buffers fill
					if end != "write timeout" {
						c.Close() // and the client goes away
					}
					switch end {
					case "admin":
						list := tunnels(t, url)
						if len(list) != 1 {
							t.Fatalf("tunnels: %+v", list)
						}
						if d := disconnect(t, url, list[0].ID); d > time.Second {
							t.Fatalf("disconnect took %s", d)
						}
						waitGone(t, url, 2*time.Second, "after an admin disconnect")
					case "write timeout":
						waitGone(t, url, 6*time.Second, "with a host that takes nothing")
						waitLogged(t, "host took no data", 1, 2*time.Second, h)
					case "shutdown":
						h.cancel()
						waitStopped(t, h, 4*time.Second)
					}
				})
			}
		})
	}
}

func TestClientThatStopsReadingIsTimedOut(t *testing.T) {
	for _, m := range relayModes {
		t.Run(m.name, func(t *testing.T) {
			h := start(t, func(c *config.Config) {
				c.Gateway.RelayLoops = &m.loops
				c.Gateway.WriteTimeout = config.Duration(2 * time.Second)
			})
			url := admin(t, h)
			port := source(t, 0)
			cfg := h.cfg("", "", m.transport)
			cfg.Token = h.token(t, "bob", "127.0.0.1", port, time.Minute)
			c, err := dial(t, cfg, "127.0.0.1", port)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close() // never read
			waitGone(t, url, 8*time.Second, "with a client that reads nothing")
			waitLogged(t, "client took no data", 1, 2*time.Second, h)
		})
	}
}
