package gateway

import (
	"sync/atomic"

	"github.com/deskway/deskway/internal/proto/bitmapupdate"
	"github.com/deskway/deskway/internal/proto/cliprdr"
	"github.com/deskway/deskway/internal/proto/sharecontrol"
)

// outputFramer cuts the host's output into whole PDUs and mends what
// the browser's client would otherwise get wrong: it widens the
// destination of each bitmap update to the bitmap's size (see package
// bitmapupdate: xrdp's padded bitmaps are otherwise drawn sheared), and
// carries the output through a resize, when the host deactivates and
// reactivates the session (see package sharecontrol: the client
// otherwise ends the session), and holds the host's clipboard offers
// until the client's clipboard channel is ready (see package cliprdr:
// the client otherwise ends the session). Anything it cannot frame
// makes it pass the rest of the session through untouched.
type outputFramer struct {
	pending []byte
	out     []byte // the whole PDUs of the last feed, reused: the caller writes them before feeding again
	off     bool
	react   sharecontrol.Reactivation
	// events are the reactivation's events of the last feed, for the log.
	events []sharecontrol.Event
	// clipIndex is the clipboard channel's place among the client's
	// channels, which the client's side of the relay writes as its
	// Connect Initial goes by (-1 for none); nil leaves the clipboard
	// alone.
	clipIndex *atomic.Int32
	clipSeen  bool // the host's Connect Response went by
	clip      cliprdr.Gate
	// clipEvents are the clipboard gate's events of the last feed.
	clipEvents []cliprdr.Event
}

// feed takes bytes from the host and returns the whole PDUs among them
// that may go to the client now.
func (f *outputFramer) feed(p []byte) ([]byte, error) {
	f.events = f.events[:0]
	f.clipEvents = f.clipEvents[:0]
	if f.off {
		return p, nil
	}
	f.pending = append(f.pending, p...)
	f.out = f.out[:0]
	done := 0
	for done < len(f.pending) {
		n, err := bitmapupdate.Len(f.pending[done:])
		if err != nil {
			return f.stop(done, err)
		}
		if n == 0 || n > len(f.pending)-done {
			break
		}
		pdu := f.pending[done : done+n]
		if _, err := bitmapupdate.Widen(pdu); err != nil {
			return f.stop(done, err)
		}
		if f.clipIndex != nil && !f.clipSeen {
			if ids, ok := cliprdr.ChannelIDs(pdu); ok {
				f.clipSeen = true
				if i := int(f.clipIndex.Load()); i >= 0 && i < len(ids) {
					f.clip.Watch(ids[i])
				}
			}
		}
		held, after, cev := f.clip.Pass(pdu)
		if cev != cliprdr.None {
			f.clipEvents = append(f.clipEvents, cev)
		}
		if !held {
			f.pass(pdu)
		}
		for _, p := range after {
			f.pass(p)
		}
		done += n
	}
	f.pending = append(f.pending[:0], f.pending[done:]...)
	return f.out, nil
}

// pass sends one whole PDU on through the reactivation.
func (f *outputFramer) pass(pdu []byte) {
	var ev sharecontrol.Event
	f.out, ev = f.react.Pass(f.out, pdu)
	if ev != sharecontrol.None {
		f.events = append(f.events, ev)
	}
}

// stop gives up framing at pending[done:]: what is held and the rest go
// out as they are, and from then on everything does.
func (f *outputFramer) stop(done int, err error) ([]byte, error) {
	f.off = true
	f.out = f.react.Release(f.out)
	for _, p := range f.clip.Release() {
		f.out = append(f.out, p...)
	}
	f.out = append(f.out, f.pending[done:]...)
	f.pending = nil
	return f.out, err
}
