// Package x224test builds the client packets of an RDP connection's
// start (an MCS Connect Initial with its client data blocks) for the tests
// of the codec and of the gateway that rewrites them, so both build them
// one way.
package x224test

import "encoding/binary"

// ConnectInitial is a client's MCS Connect Initial in its TPKT as
// MS-RDPBCGR 2.2.1.3 lays it out (BER Connect-Initial, GCC Conference
// Create Request, client data blocks), with build as the core data's
// client build, clientName in its core data and the given static channels
// in its network data.
func ConnectInitial(build uint32, clientName []byte, channels ...string) []byte {
	core := make([]byte, 212)
	binary.LittleEndian.PutUint32(core[16:], build)
	copy(core[20:52], clientName)
	net := binary.LittleEndian.AppendUint32(nil, uint32(len(channels)))
	for _, c := range channels {
		name := make([]byte, 8)
		copy(name, c)
		net = append(append(net, name...), 0x00, 0x00, 0x80, 0x80)
	}
	blocks := append(append(dataBlock(0xC001, core), dataBlock(0xC002, make([]byte, 8))...), dataBlock(0xC003, net)...)
	gcc := append([]byte{0x00, 0x08, 0x00, 0x10, 0x00, 0x01, 0xc0, 0x00, 0x44, 0x75, 0x63, 0x61}, append(PERLength(len(blocks)), blocks...)...)
	user := append([]byte{0x00, 0x05, 0x00, 0x14, 0x7c, 0x00, 0x01}, append(PERLength(len(gcc)), gcc...)...)
	params := berElem([]byte{0x30}, []byte{0x02, 0x01, 0x22, 0x02, 0x01, 0x02})
	ci := append(berElem([]byte{0x04}, []byte{1}), berElem([]byte{0x04}, []byte{1})...)
	ci = append(ci, berElem([]byte{0x01}, []byte{0xff})...)
	ci = append(append(append(ci, params...), params...), params...)
	ci = append(ci, berElem([]byte{0x04}, user)...)
	body := append([]byte{0x02, 0xf0, 0x80}, berElem([]byte{0x7f, 0x65}, ci)...)
	return append([]byte{3, 0, byte((len(body) + 4) >> 8), byte(len(body) + 4)}, body...)
}

// PERLength is a PER length determinant: one byte below 0x80, else two.
func PERLength(n int) []byte {
	if n < 0x80 {
		return []byte{byte(n)}
	}
	return []byte{0x80 | byte(n>>8), byte(n)}
}

func berElem(tag []byte, v []byte) []byte {
	out := append([]byte{}, tag...)
	if len(v) < 0x80 {
		out = append(out, byte(len(v)))
	} else {
		out = append(out, 0x82, byte(len(v)>>8), byte(len(v)))
	}
	return append(out, v...)
}

func dataBlock(typ uint16, body []byte) []byte {
	b := binary.LittleEndian.AppendUint16(nil, typ)
	b = binary.LittleEndian.AppendUint16(b, uint16(4+len(body)))
	return append(b, body...)
}
