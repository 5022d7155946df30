// Package x224 reads the few parts of RDP's connection sequence a gateway
// that terminates the host's TLS has to understand: TPKT framing (RFC
// 1006), the X.224 Connection Request and Confirm with their RDP
// negotiation fields (MS-RDPBCGR 2.2.1.1 and 2.2.1.2), the static
// channels the client asks for in its MCS Connect Initial (2.2.1.3.4),
// which the gateway can withhold, and the Client Info PDU's flags
// (2.2.1.11), where the gateway turns on auto-logon. It does no I/O.
package x224

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// TPKTHeaderLen is the length of a TPKT header: version 3, a reserved
// byte and the big-endian length of the whole packet.
const TPKTHeaderLen = 4

// Negotiated security protocols (RDP_NEG_REQ/RSP requestedProtocols and
// selectedProtocol).
const (
	ProtocolRDP      = 0x0
	ProtocolSSL      = 0x1
	ProtocolHybrid   = 0x2
	ProtocolHybridEx = 0x8
)

// TPKTLen returns the length of the TPKT packet that starts buf, or 0
// when fewer than TPKTHeaderLen bytes are there.
func TPKTLen(buf []byte) (int, error) {
	if len(buf) < TPKTHeaderLen {
		return 0, nil
	}
	if buf[0] != 3 {
		return 0, fmt.Errorf("x224: TPKT version %d, want 3", buf[0])
	}
	n := int(binary.BigEndian.Uint16(buf[2:]))
	if n < TPKTHeaderLen+3 {
		return 0, fmt.Errorf("x224: TPKT length %d too short for an X.224 header", n)
	}
	return n, nil
}

// tpdu checks that pkt is one whole TPKT packet holding an X.224 TPDU of
// the given code and returns the TPDU's variable part, after its fixed
// header of length indicator, code, references and class.
func tpdu(pkt []byte, code byte, name string) ([]byte, error) {
	n, err := TPKTLen(pkt)
	if err != nil {
		return nil, err
	}
	if n == 0 || n != len(pkt) {
		return nil, fmt.Errorf("x224: %s: TPKT length %d, packet of %d bytes", name, n, len(pkt))
	}
	x := pkt[TPKTHeaderLen:]
	li := int(x[0])
	if li+1 != len(x) || li < 6 {
		return nil, fmt.Errorf("x224: %s: length indicator %d in %d bytes", name, li, len(x))
	}
	if x[1]&0xf0 != code {
		return nil, fmt.Errorf("x224: TPDU code 0x%02x, want %s (0x%02x)", x[1], name, code)
	}
	return x[7:], nil
}

// ConnectionRequest is what a gateway needs of a client's X.224
// Connection Request.
type ConnectionRequest struct {
	// Protocols is RDP_NEG_REQ's requestedProtocols; HasNeg is false for
	// an old client that sent none (standard RDP security only).
	Protocols uint32
	HasNeg    bool
}

// ParseConnectionRequest checks that pkt is one Connection Request.
func ParseConnectionRequest(pkt []byte) (ConnectionRequest, error) {
	v, err := tpdu(pkt, 0xe0, "Connection Request")
	if err != nil {
		return ConnectionRequest{}, err
	}
	// A routing token or cookie line, ended by CR LF, may come first.
	for i := 0; i+1 < len(v); i++ {
		if v[i] == '\r' && v[i+1] == '\n' {
			v = v[i+2:]
			break
		}
	}
	var cr ConnectionRequest
	switch {
	case len(v) == 0:
	case len(v) == 8 && v[0] == 0x01 && binary.LittleEndian.Uint16(v[2:]) == 8:
		cr.HasNeg, cr.Protocols = true, binary.LittleEndian.Uint32(v[4:])
	default:
		return cr, fmt.Errorf("x224: Connection Request: %d bytes after the cookie are not an RDP_NEG_REQ", len(v))
	}
	return cr, nil
}

// ConnectionConfirm is the host's answer: the protocol it selected, or
// why it refused.
type ConnectionConfirm struct {
	Protocol uint32
	// Failure is RDP_NEG_FAILURE's code when the host refused every
	// protocol the client offered (0 when it did not).
	Failure uint32
}

// ParseConnectionConfirm checks that pkt is one Connection Confirm.
func ParseConnectionConfirm(pkt []byte) (ConnectionConfirm, error) {
	v, err := tpdu(pkt, 0xd0, "Connection Confirm")
	if err != nil {
		return ConnectionConfirm{}, err
	}
	var cc ConnectionConfirm
	switch {
	case len(v) == 0:
		cc.Protocol = ProtocolRDP
	case len(v) == 8 && binary.LittleEndian.Uint16(v[2:]) == 8 && v[0] == 0x02:
		cc.Protocol = binary.LittleEndian.Uint32(v[4:])
	case len(v) == 8 && binary.LittleEndian.Uint16(v[2:]) == 8 && v[0] == 0x03:
		cc.Failure = binary.LittleEndian.Uint32(v[4:])
		if cc.Failure == 0 {
			return cc, errors.New("x224: RDP_NEG_FAILURE with code 0")
		}
	default:
		return cc, fmt.Errorf("x224: Connection Confirm: %d bytes are not an RDP_NEG_RSP or RDP_NEG_FAILURE", len(v))
	}
	return cc, nil
}

// Client Info PDU fields.
const (
	secInfoPkt    = 0x0040 // TS_SECURITY_HEADER flags: a Client Info PDU
	InfoAutoLogon = 0x0008 // TS_INFO_PACKET flags: log on with the credentials given
)

// SetAutoLogon looks at one whole TPKT packet from the client. If it is
// the Client Info PDU (an MCS Send Data Request whose security header
// says SEC_INFO_PKT), it turns on INFO_AUTOLOGON in place and reports
// true. Any other packet is left as it is.
func SetAutoLogon(pkt []byte) (bool, error) {
	if n, err := TPKTLen(pkt); err != nil || n == 0 || n != len(pkt) {
		return false, err
	}
	b := pkt[TPKTHeaderLen:]
	// X.224 Data TPDU: length indicator 2, code 0xF0, EOT.
	if len(b) < 3 || b[0] != 2 || b[1] != 0xf0 {
		return false, nil
	}
	b = b[3:]
	// MCS Send Data Request (T.125, PER): choice 25, initiator, channel,
	// priority and segmentation, then the length of the user data.
	if len(b) < 6 || b[0]>>2 != 25 {
		return false, nil
	}
	b = b[6:]
	if len(b) < 1 {
		return false, nil
	}
	l := int(b[0])
	if l&0x80 != 0 {
		if len(b) < 2 {
			return false, nil
		}
		l = (l&0x3f)<<8 | int(b[1])
		b = b[2:]
	} else {
		b = b[1:]
	}
	if l != len(b) {
		return false, fmt.Errorf("x224: MCS user data of %d bytes in a packet with %d", l, len(b))
	}
	// Security header, then TS_INFO_PACKET: CodePage, then flags.
	if len(b) < 4+8 || binary.LittleEndian.Uint16(b)&secInfoPkt == 0 {
		return false, nil
	}
	f := b[4+4:]
	binary.LittleEndian.PutUint32(f, binary.LittleEndian.Uint32(f)|InfoAutoLogon)
	return true, nil
}

// csNet is the type of the client's network data block (TS_UD_CS_NET).
const csNet = 0xC003

// berTLV reads one BER tag-length-value with a one- or two-byte tag, as
// MCS encodes them (lengths need not be minimal).
func berTLV(b []byte) (tag int, value, rest []byte, err error) {
	if len(b) < 2 {
		return 0, nil, nil, errors.New("x224: BER element cut short")
	}
	tag, b = int(b[0]), b[1:]
	if tag&0x1f == 0x1f { // the application tag 101 of Connect-Initial: 7f 65
		tag, b = tag<<8|int(b[0]), b[1:]
	}
	if len(b) < 1 {
		return 0, nil, nil, errors.New("x224: BER length missing")
	}
	n, b := int(b[0]), b[1:]
	if n&0x80 != 0 {
		k := n & 0x7f
		if k == 0 || k > 2 || len(b) < k {
			return 0, nil, nil, fmt.Errorf("x224: BER length in %d bytes", k)
		}
		n = 0
		for _, c := range b[:k] {
			n = n<<8 | int(c)
		}
		b = b[k:]
	}
	if n > len(b) {
		return 0, nil, nil, fmt.Errorf("x224: BER element of %d bytes in %d", n, len(b))
	}
	return tag, b[:n], b[n:], nil
}

// perLen reads a PER length (one byte, or two with the top bit set).
func perLen(b []byte) (int, []byte, error) {
	if len(b) < 1 {
		return 0, nil, errors.New("x224: PER length missing")
	}
	switch {
	case b[0]&0x80 == 0:
		return int(b[0]), b[1:], nil
	case b[0]&0xc0 == 0xc0:
		return 0, nil, errors.New("x224: fragmented PER length")
	case len(b) < 2:
		return 0, nil, errors.New("x224: PER length cut short")
	}
	return int(b[0]&0x3f)<<8 | int(b[1]), b[2:], nil
}

// clientDataBlocks returns the client data blocks (TS_UD_CS_*) of an MCS
// Connect Initial, walking its structure (MS-RDPBCGR 2.2.1.3): the BER
// Connect-Initial, its userData, the GCC Conference Create Request. It
// returns nil, nil for a packet that is not a Connect Initial.
func clientDataBlocks(pkt []byte) ([]byte, error) {
	b := pkt[TPKTHeaderLen:]
	if len(b) < 5 || b[0] != 2 || b[1] != 0xf0 || b[3] != 0x7f || b[4] != 0x65 {
		return nil, nil
	}
	tag, ci, _, err := berTLV(b[3:])
	if err != nil || tag != 0x7f65 {
		return nil, fmt.Errorf("x224: Connect Initial: %v", err)
	}
	// calling and called domain selectors, upward flag, target, minimum
	// and maximum parameters, then userData.
	var v []byte
	for _, want := range []int{0x04, 0x04, 0x01, 0x30, 0x30, 0x30, 0x04} {
		if tag, v, ci, err = berTLV(ci); err != nil || tag != want {
			return nil, fmt.Errorf("x224: Connect Initial field: tag 0x%x, want 0x%x (%v)", tag, want, err)
		}
	}
	// userData: the T.124 object identifier (7 bytes), a PER length, the
	// Conference Create Request's fixed part (12 bytes) and a PER length
	// over the client data blocks.
	if len(v) < 7 {
		return nil, errors.New("x224: Connect Initial userData cut short")
	}
	// Clients disagree on what the two PER lengths count (IronRDP's
	// first is two bytes short of what follows), so they are read but not
	// trusted: the blocks run to the end of userData, and DisableChannels
	// must account for every byte of them.
	_, g, err := perLen(v[7:])
	if err != nil || len(g) < 12 {
		return nil, fmt.Errorf("x224: GCC Conference Create Request of %d bytes (%v)", len(g), err)
	}
	_, blocks, err := perLen(g[12:])
	if err != nil {
		return nil, fmt.Errorf("x224: client data length: %v", err)
	}
	return blocks, nil
}

// walkClientData calls fn with each client data block (header
// included) of pkt if it is one whole MCS Connect Initial; fn may change
// the block in place. It returns whether pkt was a Connect Initial. A
// Connect Initial whose blocks do not add up is an error.
func walkClientData(pkt []byte, fn func(typ uint16, block []byte) error) (connectInitial bool, err error) {
	if n, err := TPKTLen(pkt); err != nil || n == 0 || n != len(pkt) {
		return false, err
	}
	blocks, err := clientDataBlocks(pkt)
	if err != nil || blocks == nil {
		return false, err
	}
	for len(blocks) > 0 {
		if len(blocks) < 4 {
			return true, errors.New("x224: client data block header cut short")
		}
		typ, size := binary.LittleEndian.Uint16(blocks), int(binary.LittleEndian.Uint16(blocks[2:]))
		if size < 4 || size > len(blocks) {
			return true, fmt.Errorf("x224: client data block 0x%04x of %d bytes in %d", typ, size, len(blocks))
		}
		if err := fn(typ, blocks[:size]); err != nil {
			return true, err
		}
		blocks = blocks[size:]
	}
	return true, nil
}

// DisableChannels looks at one whole TPKT packet from the client. If it
// is an MCS Connect Initial, every static channel of its network data
// named in names (case-insensitively) is renamed so that the host opens
// nothing behind it: the client's data on it goes nowhere. It returns
// whether the packet was a Connect Initial and how many channels it
// renamed; any other packet is left as it is. A Connect Initial whose
// structure does not add up is an error: the caller must not pass it on.
func DisableChannels(pkt []byte, names []string) (connectInitial bool, renamed int, err error) {
	connectInitial, err = walkClientData(pkt, func(typ uint16, block []byte) error {
		if typ != csNet {
			return nil
		}
		if len(block) < 8 {
			return errors.New("x224: network data cut short")
		}
		count := int(binary.LittleEndian.Uint32(block[4:]))
		if count > 31 || len(block) != 8+12*count {
			return fmt.Errorf("x224: network data of %d bytes for %d channels", len(block), count)
		}
		for c := 0; c < count; c++ {
			name := block[8+12*c : 8+12*c+8]
			end := 0
			for end < len(name) && name[end] != 0 {
				end++
			}
			for _, want := range names {
				if end > 0 && strings.EqualFold(string(name[:end]), want) {
					// A name no host serves, of the same length.
					name[0] = '_'
					renamed++
					break
				}
			}
		}
		return nil
	})
	return connectInitial, renamed, err
}

// csCore is the type of the client's core data block (TS_UD_CS_CORE),
// whose keyboardLayout field starts 16 bytes in and clientBuild 20.
const (
	csCore           = 0xC001
	coreKeyboard     = 16
	coreClientBuild  = 20
	coreWithBuildLen = coreClientBuild + 4
)

// SetKeyboardLayout looks at one whole TPKT packet from the client. If
// it is an MCS Connect Initial whose core data gives no keyboard layout
// (0), the layout becomes layout (a Windows input locale identifier
// such as 0x040C, French) and it reports true. The host maps the
// client's scancodes by that layout: xrdp, given 0, uses US English,
// and IronRDP's browser client always sends 0. A layout the client gave
// is kept. Any other packet is left as it is; a Connect Initial whose
// structure does not add up is an error.
func SetKeyboardLayout(pkt []byte, layout uint32) (set bool, err error) {
	if layout == 0 {
		return false, nil
	}
	_, err = walkClientData(pkt, func(typ uint16, block []byte) error {
		if typ != csCore {
			return nil
		}
		if len(block) < coreClientBuild {
			return fmt.Errorf("x224: core data of %d bytes", len(block))
		}
		if binary.LittleEndian.Uint32(block[coreKeyboard:]) == 0 {
			binary.LittleEndian.PutUint32(block[coreKeyboard:], layout)
			set = true
		}
		return nil
	})
	return set, err
}

// RaiseClientBuild looks at one whole TPKT packet from the client. If it
// is an MCS Connect Initial whose core data gives a client build below
// build, the build becomes build, and it reports true. A host may judge
// a client by that number: xrdp resizes a session (the deactivation and
// reactivation of MS-RDPBCGR 1.3.1.3) only for a build above 419, and
// IronRDP's browser client, which handles a reactivation, sends 0. Any
// other packet is left as it is; a Connect Initial whose structure does
// not add up is an error.
func RaiseClientBuild(pkt []byte, build uint32) (raised bool, err error) {
	_, err = walkClientData(pkt, func(typ uint16, block []byte) error {
		if typ != csCore {
			return nil
		}
		if len(block) < coreWithBuildLen {
			return fmt.Errorf("x224: core data of %d bytes", len(block))
		}
		if binary.LittleEndian.Uint32(block[coreClientBuild:]) < build {
			binary.LittleEndian.PutUint32(block[coreClientBuild:], build)
			raised = true
		}
		return nil
	})
	return raised, err
}

// ConnectionRequestPacket is a Connection Request with no cookie whose
// RDP_NEG_REQ asks for protocols: what a client sends first.
func ConnectionRequestPacket(protocols uint32) []byte {
	pkt := []byte{3, 0, 0, 19, // TPKT, 19 bytes in all
		14, 0xe0, 0, 0, 0, 0, 0, // X.224 CR: length indicator, code, references, class
		0x01, 0, 8, 0, 0, 0, 0, 0} // RDP_NEG_REQ
	binary.LittleEndian.PutUint32(pkt[15:], protocols)
	return pkt
}

// ChannelIndex looks at one whole TPKT packet from the client. If it is
// an MCS Connect Initial, it returns the place of the static channel
// called name (case-insensitively) among those its network data asks
// for, -1 if it asks for none of that name: the host's Connect Response
// gives the channels' ids in that order. connectInitial is false for any
// other packet.
func ChannelIndex(pkt []byte, name string) (index int, connectInitial bool, err error) {
	index = -1
	connectInitial, err = walkClientData(pkt, func(typ uint16, block []byte) error {
		if typ != csNet || len(block) < 8 {
			return nil
		}
		count := int(binary.LittleEndian.Uint32(block[4:]))
		for c := 0; c < count && 8+12*c+8 <= len(block); c++ {
			n := block[8+12*c : 8+12*c+8]
			if end := bytes.IndexByte(n, 0); end >= 0 {
				n = n[:end]
			}
			if strings.EqualFold(string(n), name) {
				index = c
				return nil
			}
		}
		return nil
	})
	return index, connectInitial, err
}
