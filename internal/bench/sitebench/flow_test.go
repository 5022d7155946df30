package sitebench

import (
	"net"
	"testing"
	"time"
)

// TestReceiverCloseEndsOpenConnections: a bench interrupted mid-point
// tears its tunnels down under connections whose senders never close
// their ends; closing the receiver must not wait for them (the bench
// hung there after Ctrl-C).
func TestReceiverCloseEndsOpenConnections(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rc := receive(ln)
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("bytes")); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); rc.total() < 5; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the receiver counted no bytes")
		}
	}
	closed := make(chan struct{})
	go func() { rc.close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("close waited for a connection its sender never closed")
	}
	if errs := rc.errs; errs[0] != nil {
		t.Errorf("a connection the receiver closed itself counted as failed: %v", errs[0])
	}
}
