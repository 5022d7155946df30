// Package cliprdr holds back a host's clipboard offers until a strict
// client's clipboard channel can take them (MS-RDPECLIP 1.3.2.1).
//
// Why: IronRDP's browser client ends the whole session when an offer
// comes too early. Its clipboard channel becomes Ready only when the
// host has answered (Format List Response) the client's first Format
// List, which the client sends after the host's Monitor Ready; a host
// Format List that arrives before that answer makes its clipboard
// backend ask for the data at once, which its channel refuses ("not in
// Ready state"), and the refusal ends the session. xrdp's channel server
// sends a Format List whenever a program in the session copies, so a
// copy made as the session starts ends it. A Gate holds the host's
// Format Lists, and what follows them on the clipboard channel, from the
// first one until the host's Format List Response, which it lets through
// first. The package does no I/O.
package cliprdr

import (
	"bytes"
	"encoding/binary"
)

// Clipboard PDU types (CLIPRDR_HEADER msgType, 2.2.1) the gate reads.
const (
	MsgFormatList         = 0x0002
	MsgFormatListResponse = 0x0003
)

// Channel PDU flags (CHANNEL_PDU_HEADER, MS-RDPBCGR 2.2.6.1.1).
const (
	chanFirst      = 0x1
	chanLast       = 0x2
	chanCompressed = 0x00200000
)

// Bounds of what a Gate holds: a session's first offers are a few
// hundred bytes each.
const (
	maxHeld      = 64
	maxHeldBytes = 1 << 20
)

// ChannelIDs returns the static channels' MCS channel ids from one whole
// TPKT packet if it is the host's MCS Connect Response: the channelIdArray
// of its network data (TS_UD_SC_NET, MS-RDPBCGR 2.2.1.4.4), in the order
// of the channels the client asked for. ok is false for any other packet
// or one that does not add up.
func ChannelIDs(pkt []byte) (ids []uint16, ok bool) {
	// TPKT, X.224 Data, then the BER Connect-Response (application tag 102).
	if len(pkt) < 9 || pkt[0] != 3 || int(binary.BigEndian.Uint16(pkt[2:])) != len(pkt) ||
		pkt[4] != 2 || pkt[5] != 0xf0 || pkt[7] != 0x7f || pkt[8] != 0x66 {
		return nil, false
	}
	// The server data blocks follow the GCC Conference Create Response's
	// H.221 key "McDn" and a PER length, to the end of the packet.
	at := bytes.Index(pkt, []byte("McDn"))
	if at < 0 || len(pkt) < at+5 {
		return nil, false
	}
	b := pkt[at+4:]
	if b[0]&0x80 != 0 {
		b = b[2:]
	} else {
		b = b[1:]
	}
	for len(b) >= 4 {
		typ, size := binary.LittleEndian.Uint16(b), int(binary.LittleEndian.Uint16(b[2:]))
		if size < 4 || size > len(b) {
			return nil, false
		}
		if typ == 0x0C03 { // SC_NET
			if size < 8 {
				return nil, false
			}
			n := int(binary.LittleEndian.Uint16(b[6:]))
			if 8+2*n > size {
				return nil, false
			}
			ids = make([]uint16, n)
			for i := range ids {
				ids[i] = binary.LittleEndian.Uint16(b[8+2*i:])
			}
			return ids, true
		}
		b = b[size:]
	}
	return nil, false
}

// indication returns the channel and data of one whole slow-path PDU
// from the host: TPKT, X.224 Data, MCS Send Data Indication (PER: choice
// 0x68, initiator, channel, priority and segmentation, a one- or
// two-byte length).
func indication(pdu []byte) (channel uint16, data []byte, ok bool) {
	const lenAt = 4 + 3 + 6
	if len(pdu) < lenAt+1 || pdu[0] != 3 || int(binary.BigEndian.Uint16(pdu[2:])) != len(pdu) ||
		pdu[4] != 2 || pdu[5] != 0xf0 || pdu[7] != 0x68 {
		return 0, nil, false
	}
	l, hl := int(pdu[lenAt]), 1
	if l&0x80 != 0 {
		if len(pdu) < lenAt+2 {
			return 0, nil, false
		}
		l, hl = (l&0x3f)<<8|int(pdu[lenAt+1]), 2
	}
	data = pdu[lenAt+hl:]
	if l != len(data) {
		return 0, nil, false
	}
	return binary.BigEndian.Uint16(pdu[10:]), data, true
}

// Event is what a PDU did to a Gate, for the caller's log.
type Event int

// Events of Pass.
const (
	None       Event = iota
	Held             // the first PDU held: an offer came before the client's channel was ready
	Released         // the host answered the client's Format List: what was held went after it
	Overflowed       // more was held than the gate keeps: it went on as it was
)

// A Gate carries the host's output on one session's clipboard channel;
// its zero value passes everything until Watch names the channel.
type Gate struct {
	channel   uint16 // the clipboard channel's MCS id, 0 for none
	active    bool   // the host has sent on the clipboard channel
	ready     bool   // the client's channel is ready: everything passes
	held      [][]byte
	heldBytes int
}

// Watch names the clipboard channel's MCS id (from ChannelIDs).
func (g *Gate) Watch(channel uint16) { g.channel = channel }

// Active reports whether the host has sent anything on the clipboard
// channel. xrdp's channel server, which serves it, runs in the user's
// session, and starts the channel (Clipboard Capabilities, Monitor
// Ready) once a logon has succeeded, and again on each reconnection.
func (g *Gate) Active() bool { return g.active }

// Pass takes pdu, one whole output PDU from the host. Unless the gate
// holds it (held true; the gate keeps a copy), the caller sends it on,
// then the PDUs in after, which the gate held until then.
func (g *Gate) Pass(pdu []byte) (held bool, after [][]byte, ev Event) {
	if g.channel == 0 || g.ready && g.active {
		return false, nil, None
	}
	ch, data, ok := indication(pdu)
	if !ok || ch != g.channel {
		return false, nil, None
	}
	g.active = true
	if g.ready || len(data) < 8 {
		return false, nil, None
	}
	flags := binary.LittleEndian.Uint32(data[4:])
	var msg uint16
	if flags&chanFirst != 0 && flags&chanCompressed == 0 && len(data) >= 10 {
		msg = binary.LittleEndian.Uint16(data[8:])
	}
	if msg == MsgFormatListResponse && flags&chanLast != 0 {
		// The client's channel is ready once it reads this.
		g.ready = true
		if len(g.held) == 0 {
			return false, nil, None
		}
		return false, g.Release(), Released
	}
	if len(g.held) == 0 && msg != MsgFormatList {
		return false, nil, None
	}
	if len(g.held) >= maxHeld || g.heldBytes+len(pdu) > maxHeldBytes {
		// Sent before pdu, in their order.
		g.ready = true
		return true, append(g.Release(), bytes.Clone(pdu)), Overflowed
	}
	g.held = append(g.held, bytes.Clone(pdu))
	g.heldBytes += len(pdu)
	if len(g.held) == 1 {
		return true, nil, Held
	}
	return true, nil, None
}

// Release returns what the gate holds, in order, and forgets it.
func (g *Gate) Release() [][]byte {
	h := g.held
	g.held, g.heldBytes = nil, 0
	return h
}
