// Package bitmapupdate reads the framing of an RDP host's output (TPKT
// slow-path PDUs and fast-path PDUs, MS-RDPBCGR 2.2.9.1) far enough to
// find bitmap updates (TS_UPDATE_BITMAP_DATA, 2.2.9.1.1.3.1.2), and makes
// each rectangle's destination as large as its bitmap.
//
// Why: xrdp sends bitmaps whose width is rounded up to a multiple of four
// pixels, with a destination rectangle that is narrower (the extra
// columns are the screen's own pixels beside it). A client must clip to
// the destination; IronRDP's web client 0.7 draws the bitmap with the
// destination's width as its row length instead, which shears every
// updated rectangle into diagonal streaks. Drawing the whole bitmap shows
// the screen as it is. The package does no I/O.
package bitmapupdate

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// MaxPDU bounds one output PDU: a TPKT length is 16 bits, a fast-path
// length 15.
const MaxPDU = 0xFFFF

// Len returns the length of the output PDU that starts buf, or 0 when
// more bytes are needed to know it.
func Len(buf []byte) (int, error) {
	if len(buf) < 2 {
		return 0, nil
	}
	switch {
	case buf[0] == 3: // TPKT
		if len(buf) < 4 {
			return 0, nil
		}
		n := int(binary.BigEndian.Uint16(buf[2:]))
		if n < 7 {
			return 0, fmt.Errorf("bitmapupdate: TPKT length %d", n)
		}
		return n, nil
	case buf[0]&3 == 0: // fast-path
		n := int(buf[1])
		if n&0x80 != 0 {
			if len(buf) < 3 {
				return 0, nil
			}
			n = (n&0x7f)<<8 | int(buf[2])
		}
		if n < 2 {
			return 0, fmt.Errorf("bitmapupdate: fast-path length %d", n)
		}
		return n, nil
	}
	return 0, fmt.Errorf("bitmapupdate: output PDU starts with 0x%02x, neither TPKT nor fast-path", buf[0])
}

// Widen finds the bitmap updates in one whole output PDU and sets each
// rectangle's destRight and destBottom so the destination covers the
// whole bitmap. It returns how many rectangles it changed. PDUs it does
// not understand (compressed, fragmented, encrypted, anything but a
// bitmap update) are left alone.
func Widen(pdu []byte) (int, error) {
	if len(pdu) < 2 {
		return 0, nil
	}
	if pdu[0] == 3 {
		return widenSlowPath(pdu)
	}
	return widenFastPath(pdu)
}

func widenSlowPath(pdu []byte) (int, error) {
	if n, err := Len(pdu); err != nil || n != len(pdu) {
		return 0, fmt.Errorf("bitmapupdate: TPKT length %d, PDU of %d bytes (%v)", n, len(pdu), err)
	}
	// TPKT (4), X.224 Data (3), MCS Send Data Indication (PER): choice 26
	// (0x68), initiator, channel, priority and segmentation, length.
	b := pdu[4:]
	if len(b) < 3+7 || b[0] != 2 || b[1] != 0xf0 || b[3] != 0x68 {
		return 0, nil
	}
	b = b[3+6:]
	l := int(b[0])
	if l&0x80 != 0 {
		if len(b) < 2 {
			return 0, nil
		}
		l = (l&0x3f)<<8 | int(b[1])
		b = b[2:]
	} else {
		b = b[1:]
	}
	if l != len(b) {
		return 0, fmt.Errorf("bitmapupdate: MCS data of %d bytes in a PDU with %d", l, len(b))
	}
	// Share Control Header: totalLength, pduType (7: data PDU), pduSource;
	// Share Data Header: shareId, pad, streamId, uncompressedLength,
	// pduType2 (2: update), compressedType, compressedLength.
	if len(b) < 6+12 || binary.LittleEndian.Uint16(b[2:])&0xf != 7 {
		return 0, nil
	}
	d := b[6:]
	if d[8] != 2 || d[9] != 0 {
		return 0, nil // not an update, or bulk-compressed
	}
	return widenBitmapData(d[12:])
}

func widenFastPath(pdu []byte) (int, error) {
	if pdu[0]&0xc0 != 0 {
		return 0, nil // encrypted: no TLS
	}
	hl := 2
	if pdu[1]&0x80 != 0 {
		hl = 3
	}
	b := pdu[min(hl, len(pdu)):]
	changed := 0
	for len(b) > 0 {
		// updateHeader: code (4 bits), fragmentation (2), compression (2).
		code, frag, comp := b[0]&0xf, (b[0]>>4)&3, b[0]>>6
		sz := 3
		if comp&2 != 0 {
			sz = 4
		}
		if len(b) < sz {
			return changed, errors.New("bitmapupdate: fast-path update header cut short")
		}
		n := int(binary.LittleEndian.Uint16(b[sz-2:]))
		if len(b) < sz+n {
			return changed, fmt.Errorf("bitmapupdate: fast-path update of %d bytes in %d", n, len(b)-sz)
		}
		if code == 1 && frag == 0 && comp == 0 {
			c, err := widenBitmapData(b[sz : sz+n])
			changed += c
			if err != nil {
				return changed, err
			}
		}
		b = b[sz+n:]
	}
	return changed, nil
}

// widenBitmapData works on TS_UPDATE_BITMAP_DATA: updateType (1),
// numberRectangles, then TS_BITMAP_DATA each: destLeft, destTop,
// destRight, destBottom, width, height, bitsPerPixel, flags,
// bitmapLength, then bitmapLength bytes.
func widenBitmapData(b []byte) (int, error) {
	if len(b) < 4 || binary.LittleEndian.Uint16(b) != 1 {
		return 0, nil
	}
	n := int(binary.LittleEndian.Uint16(b[2:]))
	b = b[4:]
	changed := 0
	for i := 0; i < n; i++ {
		if len(b) < 18 {
			return changed, fmt.Errorf("bitmapupdate: rectangle %d of %d cut short", i+1, n)
		}
		le := func(o int) int { return int(binary.LittleEndian.Uint16(b[o:])) }
		left, top, right, bottom, w, h, size := le(0), le(2), le(4), le(6), le(8), le(10), le(16)
		if w > 0 && h > 0 && (right != left+w-1 || bottom != top+h-1) && left+w-1 <= 0xffff && top+h-1 <= 0xffff {
			binary.LittleEndian.PutUint16(b[4:], uint16(left+w-1))
			binary.LittleEndian.PutUint16(b[6:], uint16(top+h-1))
			changed++
		}
		if len(b) < 18+size {
			return changed, fmt.Errorf("bitmapupdate: rectangle %d: %d bytes of bitmap in %d", i+1, size, len(b)-18)
		}
		b = b[18+size:]
	}
	return changed, nil
}
