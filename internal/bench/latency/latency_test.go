package latency

import (
	"bufio"
	"context"
	"io"
	"net"
	"testing"
	"time"
)

func TestProxyAddsRoundTripDelay(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{Target: echo.Addr().String(), OneWay: 25 * time.Millisecond}
	served := make(chan error, 1)
	go func() { served <- p.Serve(ctx, ln) }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	for i := range 5 {
		start := time.Now()
		if _, err := c.Write([]byte("ping\n")); err != nil {
			t.Fatal(err)
		}
		line, err := r.ReadString('\n')
		if err != nil || line != "ping\n" {
			t.Fatalf("echo %d: %q %v", i, line, err)
		}
		if rtt := time.Since(start); rtt < 50*time.Millisecond || rtt > 500*time.Millisecond {
			t.Fatalf("round trip %v through a 25 ms each way proxy, want about 50 ms", rtt)
		}
	}
	// Closing our side reaches the server, whose close comes back as EOF.
	_ = c.(*net.TCPConn).CloseWrite()
	if _, err := r.ReadByte(); err != io.EOF {
		t.Fatalf("after half-close: %v, want EOF", err)
	}
	c.Close()
	cancel()
	if err := <-served; err != nil {
		t.Fatal(err)
	}
}
