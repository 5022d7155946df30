// Package sharecontrol carries a host's output through a deactivation
// and reactivation of the session (MS-RDPBCGR 1.3.1.3), mending what a
// strict client such as IronRDP's browser client cannot take from xrdp.
//
// Why: to resize a session to a new window, xrdp deactivates and
// reactivates it, and does two things mstsc and FreeRDP forgive but
// IronRDP does not. Its Deactivate All PDU is only the six-byte Share
// Control Header, without the shareID, lengthSourceDescriptor and
// sourceDescriptor of 2.2.3.1 (Windows XP sent that short form too); and
// it sends the resized screen straight after its Demand Active, before
// the client has finalized (2.2.1.22: graphics come after the Font Map).
// IronRDP ends the session on either. Reactivation completes the short
// PDU and holds the host's other output from the Deactivate All until
// the Font Map has gone to the client, then lets it go in order. The
// package does no I/O.
package sharecontrol

import "encoding/binary"

// PDU types of the Share Control Header's pduType (low four bits), and
// the Share Data Header's pduType2 of the data PDUs a client waits for
// while it finalizes (2.2.1.19 to 2.2.1.22, 2.2.5.1.1, 2.2.12.1).
const (
	typeDemandActive  = 0x1
	typeDeactivateAll = 0x6
	typeData          = 0x7

	data2Control       = 0x14
	data2Synchronize   = 0x1f
	data2FontMap       = 0x28
	data2SetErrorInfo  = 0x2f
	data2MonitorLayout = 0x37
)

// DefaultMaxHeld bounds the output a Reactivation holds: a resized
// screen's first picture, compressed, is far smaller.
const DefaultMaxHeld = 16 << 20

// slowPath finds the MCS data of one whole slow-path output PDU: TPKT
// (4 bytes), X.224 Data (3), MCS Send Data Indication (PER: choice 0x68,
// initiator, channel, priority and segmentation, then a one- or two-byte
// length). It returns where the length starts and the data, or ok false
// for anything else.
func slowPath(pdu []byte) (lenAt int, data []byte, ok bool) {
	if len(pdu) < 4+3+6+1 || pdu[0] != 3 || int(binary.BigEndian.Uint16(pdu[2:])) != len(pdu) {
		return 0, nil, false
	}
	if pdu[4] != 2 || pdu[5] != 0xf0 || pdu[7] != 0x68 {
		return 0, nil, false
	}
	lenAt = 4 + 3 + 6
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
	return lenAt, data, true
}

// kind is what an output PDU is to a reactivation.
type kind int

const (
	other         kind = iota // graphics, pointers, channels' data, fast-path output
	shortDeactive             // a Deactivate All of the header alone
	deactivate                // a Deactivate All with its fields
	demandActive
	finalizing // Synchronize, Control, Set Error Info, Monitor Layout
	fontMap
)

// classify reads pdu's Share Control Header, if it has one whose
// totalLength is the whole MCS data d, which starts after the MCS length
// at lenAt.
func classify(pdu []byte) (k kind, lenAt int, d []byte) {
	lenAt, d, ok := slowPath(pdu)
	if !ok || len(d) < 6 || int(binary.LittleEndian.Uint16(d)) != len(d) {
		return other, 0, nil
	}
	switch binary.LittleEndian.Uint16(d[2:]) & 0xf {
	case typeDeactivateAll:
		if len(d) == 6 {
			return shortDeactive, lenAt, d
		}
		return deactivate, lenAt, d
	case typeDemandActive:
		if len(d) >= 10 {
			return demandActive, lenAt, d
		}
	case typeData:
		if len(d) < 6+12 {
			return other, 0, nil
		}
		switch d[6+8] {
		case data2Control, data2Synchronize, data2SetErrorInfo, data2MonitorLayout:
			return finalizing, lenAt, d
		case data2FontMap:
			return fontMap, lenAt, d
		}
	}
	return other, 0, nil
}

// Event says what a PDU did to a Reactivation, for the log.
type Event int

// What Pass reports.
const (
	None       Event = iota
	Began            // a Deactivate All: output other than the reactivation's own is held
	Completed        // as Began, from a short Deactivate All that Pass completed
	Finished         // the Font Map went out, and the held output after it
	Overflowed       // more than MaxHeld was held: it all went out, in order, without waiting
)

// Reactivation follows one session's output. The zero value is ready,
// holding at most DefaultMaxHeld bytes.
type Reactivation struct {
	// MaxHeld bounds the bytes held; 0 means DefaultMaxHeld.
	MaxHeld int

	shareID uint32 // of the last Demand Active
	active  bool   // from a Deactivate All to its Font Map
	held    []byte
}

// Pass takes one whole output PDU and appends to dst what to send the
// client now: pdu itself, completed, held back, or with the output held
// before it.
func (r *Reactivation) Pass(dst, pdu []byte) ([]byte, Event) {
	k, lenAt, d := classify(pdu)
	switch k {
	case shortDeactive:
		r.active = true
		return complete(dst, pdu[:lenAt], d, r.shareID), Completed
	case deactivate:
		r.active = true
		return append(dst, pdu...), Began
	case demandActive:
		r.shareID = binary.LittleEndian.Uint32(d[6:])
		return append(dst, pdu...), None
	}
	if !r.active {
		return append(dst, pdu...), None
	}
	switch k {
	case finalizing:
		return append(dst, pdu...), None
	case fontMap:
		r.active = false
		dst = append(append(dst, pdu...), r.held...)
		r.held = r.held[:0]
		return dst, Finished
	}
	r.held = append(r.held, pdu...)
	max := r.MaxHeld
	if max == 0 {
		max = DefaultMaxHeld
	}
	if len(r.held) > max {
		r.active = false
		dst = append(dst, r.held...)
		r.held = nil
		return dst, Overflowed
	}
	return dst, None
}

// Release appends the output held so far to dst and stops holding: for
// a caller that can no longer frame the host's output.
func (r *Reactivation) Release(dst []byte) []byte {
	dst = append(dst, r.held...)
	r.held = nil
	r.active = false
	return dst
}

// complete appends a short Deactivate All, whose headers up to the MCS
// length are head and whose data d is the Share Control Header alone, as
// the whole PDU of 2.2.3.1: shareID, a lengthSourceDescriptor of 1 and a
// sourceDescriptor of 0.
func complete(dst, head, d []byte, shareID uint32) []byte {
	const extra = 4 + 2 + 1
	start := len(dst)
	dst = append(dst, head...)
	dst = append(dst, 0x80, byte(6+extra)) // the two-byte PER form, as good as the one-byte
	dst = append(dst, d...)
	dst = binary.LittleEndian.AppendUint32(dst, shareID)
	dst = append(dst, 1, 0, 0)
	out := dst[start:]
	binary.LittleEndian.PutUint16(out[len(out)-6-extra:], 6+extra)
	binary.BigEndian.PutUint16(out[2:], uint16(len(out)))
	return dst
}
