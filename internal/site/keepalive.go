package site

import (
	"encoding/binary"
	"net"
	"time"
)

// GRE keepalives are no part of RFC 2784 or 2890; routers (Cisco's, and
// those that copy them) probe a tunnel by sending, inside it, a GRE
// packet addressed from the far end back to themselves. The far end
// decapsulates it and routes the inner packet, which goes back across
// the underlay to the router: the tunnel is up while these come back.
// The gateway has no kernel route for it to follow, so it answers
// itself: an inner packet of IP protocol 47 from this underlay address
// to the sending site's is sent back as it is, and counted.

// keepalive tells an inner packet that is a keepalive from st and, if
// it is, sends it back to the site. Only the site itself is ever sent
// to, so a forged keepalive cannot aim the gateway at anyone else.
func (u *underlay) keepalive(t *tenant, st *peerSite, inner []byte) bool {
	var hl int
	switch inner[0] >> 4 {
	case 4:
		hl = int(inner[0]&0x0f) * 4
		// A fragment is no keepalive: the router sends a whole one.
		if hl < 20 || hl > len(inner) || inner[9] != 47 || binary.BigEndian.Uint16(inner[6:])&0x3fff != 0 {
			return false
		}
	case 6:
		if len(inner) < 40 || inner[6] != 47 {
			return false
		}
		hl = 40
	default:
		return false
	}
	if innerSource(inner) != u.local || innerDest(inner) != st.peer {
		return false
	}
	st.lastIn.Store(time.Now().UnixNano())
	// The raw socket writes the IP header: the GRE packet inside goes as
	// it came, key, flags and all, so the router recognises its own.
	if _, err := u.conn.WriteTo(inner[hl:], &net.IPAddr{IP: st.peer.AsSlice()}); err != nil {
		t.m.drop(dropSendError)
		return true
	}
	st.keepalives.Add(1)
	t.m.keepalives.Inc()
	return true
}
