package site

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"

	"github.com/deskway/deskway/internal/proto/gre"
)

const (
	// maxReadFailures reads failing in a row end the encapsulating loop.
	maxReadFailures = 100
	// fullWait is how long a send waits for the underlay's full queue
	// to drain, at most maxFullWaits times a batch.
	fullWait     = 50 * time.Microsecond
	maxFullWaits = 200
)

// encapLoop reads the tenant's device until it is closed and sends each
// packet to the site whose prefixes hold its destination, a batch per
// site.
func (t *tenant) encapLoop(log *slog.Logger) error {
	n := t.dev.BatchSize()
	bufs := make([][]byte, n)
	sizes := make([]int, n)
	for i := range bufs {
		bufs[i] = make([]byte, headroom+maxDatagram)
	}
	pending := map[*peerSite][][]byte{}
	failures := 0
	for {
		k, err := t.dev.Read(bufs, sizes, headroom)
		switch {
		case err == nil:
			failures = 0
		case errors.Is(err, os.ErrClosed) || t.closing.Load():
			// Closing the device also ends its netlink listener, whose
			// error may come out of this read instead.
			return errClosed
		default:
			// One packet the offload code refuses (or a superpacket of
			// more segments than bufs, whose first ones were read) is
			// not the device's end; a device that fails every read is.
			t.m.drop(dropDeviceError)
			if failures++; failures == maxReadFailures {
				return fmt.Errorf("site: tenant %s: read %s: %w", t.name, t.ifName, err)
			}
			log.Debug("read from tunnel device", "tenant", t.name, "error", err)
		}
		routes, mtu := t.routes.Load(), t.c().mtu
		for i := range k {
			pkt := bufs[i][headroom : headroom+sizes[i]]
			if len(pkt) < 20 || (pkt[0]>>4 == 6 && len(pkt) < 40) || (pkt[0]>>4 != 4 && pkt[0]>>4 != 6) {
				t.m.drop(dropBadInner)
				continue
			}
			st, ok := routes.Lookup(innerDest(pkt))
			if !ok || st.link == nil {
				t.m.drop(dropNoRoute)
				continue
			}
			if len(pkt) > mtu && !t.fragmentable(pkt) {
				t.tooBig(pkt)
				continue
			}
			pending[st] = append(pending[st], bufs[i][:headroom+sizes[i]])
		}
		for st, pkts := range pending {
			if len(pkts) == 0 {
				continue
			}
			if err := st.link.Send(pkts, headroom); err != nil {
				log.Debug("send to site", "tenant", t.name, "site", st.name, "error", err)
			}
			pending[st] = pkts[:0] // kept for the next batch, as the sites are
		}
	}
}

// greLink is a site reached over GRE with the tenant's key. Its Send is
// called by the tenant's encapsulating loop alone.
type greLink struct {
	u    *underlay
	t    *tenant
	site *peerSite
	msgs []ipv4.Message
	// frames sends on u's packet socket when u has one (frames.go).
	frames frameSender
	pkts   [][]byte
}

// Send puts the GRE header in each packet's headroom and sends the
// batch to the site.
func (l *greLink) Send(bufs [][]byte, offset int) error {
	addr := &net.IPAddr{IP: l.site.peer.AsSlice()}
	tc := l.t.c()
	h := gre.Header{Checksum: tc.checksum, HasKey: true, Key: l.t.key, HasSeq: tc.sequence}
	hl := h.Len()
	l.msgs, l.pkts = l.msgs[:0], l.pkts[:0]
	var bytes uint64
	for _, b := range bufs {
		inner := b[offset:]
		h.Protocol = gre.ProtoIPv4
		if inner[0]>>4 == 6 {
			h.Protocol = gre.ProtoIPv6
		}
		if h.HasSeq {
			h.Seq = l.site.seq.Add(1) - 1
		}
		pkt := b[offset-hl:]
		if err := h.Put(pkt); err != nil {
			l.t.m.drop(dropBadInner)
			continue
		}
		bytes += uint64(len(inner))
		l.msgs = append(l.msgs, ipv4.Message{Buffers: [][]byte{pkt}, Addr: addr})
		if offset-hl >= frameHead {
			// The frame's headers go in the room before GRE's.
			l.pkts = append(l.pkts, b[offset-hl-frameHead:])
		}
	}
	sent, err := l.write()
	if err != nil {
		for range len(l.msgs) - sent {
			l.t.m.drop(dropSendError)
		}
		return fmt.Errorf("send to %s: %w", l.site.peer, err)
	}
	l.site.pktsOut.Add(uint64(sent))
	l.site.bytesOut.Add(bytes)
	l.t.m.pktsOut.Add(float64(sent))
	l.t.m.bytesOut.Add(float64(bytes))
	return nil
}

// write sends l.msgs, the batch's GRE datagrams: as frames (l.pkts)
// where the link allows (frames.go), else on the raw socket. It returns
// how many were sent.
func (l *greLink) write() (int, error) {
	if f := l.u.frames; f != nil && len(l.pkts) == len(l.msgs) {
		p, err := l.frames.route(f, l.site.peer, time.Now())
		if err != nil {
			l.u.log.Debug("read the path to a site", "site", l.site.peer, "error", err)
		}
		if p != nil {
			ok, err := l.frames.send(f, p, l.site.peer, l.pkts)
			if ok {
				var se *sendError
				if errors.As(err, &se) {
					return se.sent, err
				}
				return len(l.msgs), nil
			}
		}
	}
	sent, full := 0, 0
	for sent < len(l.msgs) {
		n, err := l.u.bc.WriteBatch(l.msgs[sent:], 0)
		if errors.Is(err, unix.ENOBUFS) && full < maxFullWaits {
			// The underlay device's queue is full: the datagrams not
			// sent yet wait for it to drain rather than being lost,
			// which TCP inside would take for congestion.
			full++
			time.Sleep(fullWait)
			continue
		}
		if err != nil {
			return sent, err
		}
		sent += n
	}
	return sent, nil
}
