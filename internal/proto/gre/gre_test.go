package gre

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"
)

// Vectors from scapy 2.6 (Debian's python3-scapy), an implementation
// independent of this one; each line names the scapy expression.
var scapyVectors = []struct {
	name string
	hex  string
	want Header
}{
	// GRE(key_present=1, key=0x1001, proto=0x0800)/IP(src="192.168.1.10", dst="10.0.0.10")/ICMP(id=1, seq=1)
	{"key", "20000800000010014500001c000100004001af24c0a8010a0a00000a0800f7fd00010001",
		Header{Protocol: ProtoIPv4, HasKey: true, Key: 0x1001}},
	// GRE(chksum_present=1, key_present=1, seqnum_present=1, key=7, seqence_number=42, proto=0x86DD)/IPv6(src="fd00:1::10", dst="fd00::10")/ICMPv6EchoRequest(id=1, seq=1)
	{"checksum key seq", "b00086dd2eea0000000000070000002a6000000000083a40fd000001000000000000000000000010fd0000000000000000000000000000108000859800010001",
		Header{Protocol: ProtoIPv6, Checksum: true, HasKey: true, Key: 7, HasSeq: true, Seq: 42}},
	// GRE(proto=0x0800)/IP(src="192.168.1.10", dst="10.0.0.10")/ICMP(id=2, seq=3)
	{"plain", "000008004500001c000100004001af24c0a8010a0a00000a0800f7fa00020003",
		Header{Protocol: ProtoIPv4}},
	// GRE(chksum_present=1, proto=0x0800)/IP(src="192.168.1.10", dst="10.0.0.10", ttl=9)/b"x" (odd length)
	{"checksum odd length", "80000800fffe000045000015000100000900e62cc0a8010a0a00000a78",
		Header{Protocol: ProtoIPv4, Checksum: true}},
}

func TestScapyVectors(t *testing.T) {
	for _, v := range scapyVectors {
		t.Run(v.name, func(t *testing.T) {
			b, _ := hex.DecodeString(v.hex)
			var p Packet
			if err := p.Decode(b); err != nil {
				t.Fatalf("decode: %v", err)
			}
			if p.Header != v.want {
				t.Fatalf("header %+v, want %+v", p.Header, v.want)
			}
			if !bytes.Equal(p.Payload, b[v.want.Len():]) {
				t.Fatalf("payload %x", p.Payload)
			}
			got, err := p.Append(nil)
			if err != nil || !bytes.Equal(got, b) {
				t.Fatalf("encode: %x, %v; want %x", got, err, b)
			}
		})
	}
}

func TestDecodeRefusals(t *testing.T) {
	for _, c := range []struct {
		name string
		hex  string
		kind Kind
		off  int
	}{
		{"empty", "", Short, 0},
		{"three bytes", "000008", Short, 3},
		{"key flag without key", "2000080000", Short, 5},
		{"version 1", "00010800", BadVersion, 1},
		{"routing bit (RFC 1701)", "40000800", Reserved, 0},
		{"strict source route", "08000800", Reserved, 0},
		{"recursion control", "01000800", Reserved, 0},
		{"bits 8-12", "00080800", Reserved, 0},
		{"ARP inside", "00000806", BadProtocol, 2},
		{"transparent ethernet bridging", "00006558", BadProtocol, 2},
		{"checksum wrong", "80000800fffd000045000015000100000900e62cc0a8010a0a00000a78", BadChecksum, 4},
		// Checksum right but reserved1 set: the sum includes it, so
		// fffe - 0001 keeps the sum at 0xffff.
		{"reserved1 set", "80000800fffd000145000015000100000900e62cc0a8010a0a00000a78", Reserved, 6},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, _ := hex.DecodeString(c.hex)
			var p Packet
			err := p.Decode(b)
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("got %v, want a *DecodeError", err)
			}
			if de.Kind != c.kind || de.Offset != c.off {
				t.Fatalf("got %s at %d (%v), want %s at %d", de.Kind, de.Offset, err, c.kind, c.off)
			}
		})
	}
	var p Packet
	var de *DecodeError
	if err := p.Decode(make([]byte, MaxPacket+1)); !errors.As(err, &de) || de.Kind != TooLong {
		t.Fatalf("a datagram too long: %v", err)
	}
}

func TestEncodeRefusesOtherProtocols(t *testing.T) {
	p := Packet{Header: Header{Protocol: 0x0806}, Payload: []byte{1}}
	if b, err := p.Append([]byte{9}); err == nil || !bytes.Equal(b, []byte{9}) {
		t.Fatalf("ARP encoded: %x, %v", b, err)
	}
}

// Put writes in place, in the headroom before a payload already there.
func TestPutInPlace(t *testing.T) {
	h := Header{Protocol: ProtoIPv4, Checksum: true, HasKey: true, Key: 0x1001, HasSeq: true, Seq: 9}
	payload, _ := hex.DecodeString("4500001c000100004001af24c0a8010a0a00000a0800f7fd00010001")
	buf := make([]byte, 32+len(payload))
	copy(buf[32:], payload)
	pkt := buf[32-h.Len():]
	if err := h.Put(pkt); err != nil {
		t.Fatal(err)
	}
	var p Packet
	if err := p.Decode(pkt); err != nil || p.Header != h || !bytes.Equal(p.Payload, payload) {
		t.Fatalf("decoded %+v %x, %v", p.Header, p.Payload, err)
	}
}
