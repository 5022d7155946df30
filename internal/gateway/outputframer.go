package gateway

import (
	"github.com/deskway/deskway/internal/proto/bitmapupdate"
	"github.com/deskway/deskway/internal/proto/sharecontrol"
)

// outputFramer cuts the host's output into whole PDUs and mends what
// the browser's client would otherwise get wrong: it widens the
// destination of each bitmap update to the bitmap's size (see package
// bitmapupdate: xrdp's padded bitmaps are otherwise drawn sheared), and
// carries the output through a resize, when the host deactivates and
// reactivates the session (see package sharecontrol: the client
// otherwise ends the session). Anything it cannot frame makes it pass
// the rest of the session through untouched.
type outputFramer struct {
	pending []byte
	out     []byte // the whole PDUs of the last feed, reused: the caller writes them before feeding again
	off     bool
	react   sharecontrol.Reactivation
	// events are the reactivation's events of the last feed, for the log.
	events []sharecontrol.Event
}

// feed takes bytes from the host and returns the whole PDUs among them
// that may go to the client now.
func (f *outputFramer) feed(p []byte) ([]byte, error) {
	f.events = f.events[:0]
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
		var ev sharecontrol.Event
		f.out, ev = f.react.Pass(f.out, pdu)
		if ev != sharecontrol.None {
			f.events = append(f.events, ev)
		}
		done += n
	}
	f.pending = append(f.pending[:0], f.pending[done:]...)
	return f.out, nil
}

// stop gives up framing at pending[done:]: what is held and the rest go
// out as they are, and from then on everything does.
func (f *outputFramer) stop(done int, err error) ([]byte, error) {
	f.off = true
	f.out = f.react.Release(f.out)
	f.out = append(f.out, f.pending[done:]...)
	f.pending = nil
	return f.out, err
}
