package kernelgre

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"
	"time"
)

// udp4 is an IPv4 UDP packet from src to dst:port carrying payload,
// its header checksum filled in (UDP's left 0, which IPv4 allows).
func udp4(src, dst string, port uint16, payload string) []byte {
	p := make([]byte, 28+len(payload))
	p[0], p[8], p[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
	copy(p[12:], net.ParseIP(src).To4())
	copy(p[16:], net.ParseIP(dst).To4())
	var c uint32
	for i := 0; i < 20; i += 2 {
		c += uint32(binary.BigEndian.Uint16(p[i:]))
	}
	for c > 0xffff {
		c = c&0xffff + c>>16
	}
	binary.BigEndian.PutUint16(p[10:], ^uint16(c))
	binary.BigEndian.PutUint16(p[20:], 4000)
	binary.BigEndian.PutUint16(p[22:], port)
	binary.BigEndian.PutUint16(p[24:], uint16(8+len(payload)))
	copy(p[28:], payload)
	return p
}

// gre is a GRE header with the flags word given, then the key when K is
// set, a zero word for C and for S, and the inner packet.
func gre(flags uint16, proto uint16, key uint32, inner []byte) []byte {
	h := binary.BigEndian.AppendUint16(nil, flags)
	h = binary.BigEndian.AppendUint16(h, proto)
	if flags&0x8000 != 0 {
		h = append(h, 0, 0, 0, 0)
	}
	if flags&0x2000 != 0 {
		h = binary.BigEndian.AppendUint32(h, key)
	}
	if flags&0x1000 != 0 {
		h = append(h, 0, 0, 0, 1)
	}
	return append(h, inner...)
}

// TestKernelGREPassesUp sends GRE from the office end's underlay to the
// gateway end: what the program does not know or must not forward (a
// spoofed inner source, an unknown key, checksum or sequence flags) is
// left to the stack unchanged, where the userspace datapath's raw
// socket reads it, and never reaches the tenant; a well-formed datagram
// reaches the tenant and not the raw socket.
func TestKernelGREPassesUp(t *testing.T) {
	needRoot(t)
	t.Parallel()
	a, b := pair(t)
	var raw, host net.PacketConn
	if err := inNS(t, b.ul, func() (err error) {
		raw, err = net.ListenPacket("ip4:gre", "198.51.100.1")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if err := inNS(t, b.ten, func() (err error) {
		host, err = net.ListenPacket("udp4", "10.0.0.10:5002")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	var send net.PacketConn
	if err := inNS(t, a.ul, func() (err error) {
		send, err = net.ListenPacket("ip4:gre", "198.51.100.2")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer send.Close()
	to := &net.IPAddr{IP: net.ParseIP("198.51.100.1")}
	good := func(tag string) []byte {
		return gre(0x2000, 0x0800, 1001, udp4("192.168.1.10", "10.0.0.10", 5002, tag))
	}
	cases := map[string][]byte{
		"spoofed":     gre(0x2000, 0x0800, 1001, udp4("192.168.9.9", "10.0.0.10", 5002, "spoofed")),
		"unknown key": gre(0x2000, 0x0800, 1002, udp4("192.168.1.10", "10.0.0.10", 5002, "unknown key")),
		"checksum":    gre(0xa000, 0x0800, 1001, udp4("192.168.1.10", "10.0.0.10", 5002, "checksum")),
		"sequence":    gre(0x3000, 0x0800, 1001, udp4("192.168.1.10", "10.0.0.10", 5002, "sequence")),
		"no key":      gre(0x0000, 0x0800, 0, udp4("192.168.1.10", "10.0.0.10", 5002, "no key")),
		"version 1":   gre(0x2001, 0x0800, 1001, udp4("192.168.1.10", "10.0.0.10", 5002, "version 1")),
		"protocol":    gre(0x2000, 0x6558, 1001, udp4("192.168.1.10", "10.0.0.10", 5002, "protocol")),
		"short inner": gre(0x2000, 0x0800, 1001, []byte{0x45, 0}),
	}
	buf := make([]byte, 2048)
	for name, dgram := range cases {
		if _, err := send.WriteTo(dgram, to); err != nil {
			t.Fatalf("%s: send: %v", name, err)
		}
		// Each comes up unchanged, and before the good datagram sent
		// after it reaches the tenant.
		_ = raw.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, _, err := raw.ReadFrom(buf)
		if err != nil {
			t.Fatalf("%s: not passed up to the stack: %v", name, err)
		}
		if !bytes.Equal(buf[:n], dgram) {
			t.Fatalf("%s: passed up changed: % x, sent % x", name, buf[:n], dgram)
		}
		if _, err := send.WriteTo(good(name), to); err != nil {
			t.Fatal(err)
		}
		_ = host.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, _, err = host.ReadFrom(buf)
		if err != nil {
			t.Fatalf("after %s: the well-formed datagram did not reach the tenant: %v", name, err)
		}
		if string(buf[:n]) != name {
			t.Fatalf("%s: the tenant received %q, not the well-formed datagram sent after", name, buf[:n])
		}
	}
	// The well-formed ones were the program's: none reached the stack.
	_ = raw.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, _, err := raw.ReadFrom(buf); err == nil {
		t.Fatalf("a datagram reached the stack: % x", buf[:n])
	}
}
