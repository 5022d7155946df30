// Package loopback finds free loopback ports and waits for a server
// started on one; tests, benches and the PostgreSQL cluster helper share it.
package loopback

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"time"
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
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

// FreePorts returns n different ports as FreePort does: each is held
// while the next is drawn, so two of one server's listeners never get the
// same port.
func FreePorts(n int) ([]int, error) {
	var held []net.Listener
	defer func() {
		for _, ln := range held {
			ln.Close()
		}
	}()
	ports := make([]int, 0, n)
	for try := 0; len(ports) < n && try < 200*n; try++ {
		port := 20000 + rand.IntN(12000)
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
