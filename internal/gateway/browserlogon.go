package gateway

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/deskway/deskway/internal/proto/rdcleanpath"
	"github.com/deskway/deskway/internal/proto/tsgu"
	"github.com/deskway/deskway/internal/proto/x224"
)

// logonWatch passes the client's connection sequence through whole
// packets: CredSSP's DER messages when the host chose NLA, then TPKT
// packets until the Client Info PDU, where it turns on auto-logon (the
// browser client never sets it, and without it xrdp shows its own login
// dialog although the user gave the credentials). On the way, in the
// client's MCS Connect Initial, it raises the client build
// (browserClientBuild) and renames the static channels the connection
// policy withholds, so the host opens none of them; while channels
// are withheld, anything else before the Connect Initial ends the
// session rather than slip past. After the Client Info PDU, or at the
// first packet of another kind once the Connect Initial is through, it
// passes bytes on untouched.
type logonWatch struct {
	withhold []string
	// creds, when set, replace whatever the client put in its Client
	// Info PDU (single sign-on with the user's desktop account).
	creds    *x224.Credentials
	pending  []byte
	sawMCS   bool // the Connect Initial went through
	done     bool
	set      bool // auto-logon was turned on by the last feed
	withheld int  // channels renamed by the last feed
	raised   bool // the client build was raised by the last feed
	layout   uint32
	keyboard bool // the keyboard layout was set by the last feed
	// clipIndex receives the clipboard channel's place among those the
	// Connect Initial asks for (after withheld ones are renamed).
	clipIndex *atomic.Int32
}

// browserClientBuild is the client build the gateway reports for a
// browser client that reports an older one (IronRDP's sends 0): xrdp
// resizes a session to a new window size, by deactivating and
// reactivating it, only for a build above 419. 2600 is what FreeRDP
// reports.
const browserClientBuild = 2600

// withheldChannels are the static channels a policy's redirection flags
// forbid: the clipboard's, and device redirection's when every device
// class is off. A browser cannot be trusted to honour the flags as
// mstsc does, so the gateway enforces them.
func withheldChannels(flags uint32) []string {
	if flags&tsgu.RedirEnableAll != 0 {
		return nil
	}
	all := flags&tsgu.RedirDisableAll != 0
	var out []string
	if all || flags&tsgu.RedirDisableClipboard != 0 {
		out = append(out, "cliprdr")
	}
	devices := tsgu.RedirDisableDrive | tsgu.RedirDisablePrinter | tsgu.RedirDisablePort | tsgu.RedirDisablePnP
	if all || flags&devices == devices {
		out = append(out, "rdpdr")
	}
	return out
}

// feed takes bytes from the client and returns those to send on now.
func (w *logonWatch) feed(p []byte) ([]byte, error) {
	if w.done {
		return p, nil
	}
	w.pending = append(w.pending, p...)
	var out []byte
	for len(w.pending) > 0 {
		var n int
		var err error
		switch w.pending[0] {
		case 0x30: // CredSSP (a DER TSRequest), before the connection sequence
			n, err = rdcleanpath.Len(w.pending, 0xFFFF)
			if errors.Is(err, rdcleanpath.ErrShort) {
				return out, nil
			}
		case 3:
			n, err = x224.TPKTLen(w.pending)
		default:
			if len(w.withhold) > 0 && !w.sawMCS {
				return nil, fmt.Errorf("a packet starting 0x%02x before the MCS Connect Initial, while channels are withheld", w.pending[0])
			}
			w.done = true
			out = append(out, w.pending...)
			w.pending = nil
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if n == 0 || len(w.pending) < n {
			return out, nil
		}
		pkt := w.pending[:n]
		if pkt[0] == 3 {
			ci, k, err := x224.DisableChannels(pkt, w.withhold)
			if err != nil {
				return nil, err
			}
			w.sawMCS = w.sawMCS || ci
			w.withheld += k
			if ci && w.clipIndex != nil {
				i, _, err := x224.ChannelIndex(pkt, "cliprdr")
				if err != nil {
					return nil, err
				}
				w.clipIndex.Store(int32(i))
			}
			raised, err := x224.RaiseClientBuild(pkt, browserClientBuild)
			if err != nil {
				return nil, err
			}
			w.raised = w.raised || raised
			kbd, err := x224.SetKeyboardLayout(pkt, w.layout)
			if err != nil {
				return nil, err
			}
			w.keyboard = w.keyboard || kbd
			var ok bool
			if w.creds != nil {
				pkt, ok, err = x224.SetCredentials(pkt, *w.creds)
			} else {
				ok, err = x224.SetAutoLogon(pkt)
			}
			if err != nil {
				return nil, err
			}
			if ok {
				w.set = true
				w.done = w.sawMCS || len(w.withhold) == 0
			}
		}
		out = append(out, pkt...)
		w.pending = w.pending[n:]
		if w.done {
			break
		}
	}
	out = append(out, w.pending...)
	w.pending = nil
	return out, nil
}

// watchLogon gives the host gateway.browser_logon_timeout from the
// Client Info PDU to show a logged-on desktop, and ends the session as a
// refused logon if it does not: xrdp answers a wrong password with its
// own "login failed" dialog inside the desktop, says nothing of it on
// the wire (no Save Session Info or Set Error Info PDU, and no setting
// makes a failed auto-logon disconnect), and the page would show that
// dialog with no way on. The sign of a logged-on desktop is xrdp's
// channel server, which runs in the user's session, speaking on the
// clipboard channel; where the client asked for no clipboard channel, or
// the policy withheld it, there is no sign to wait for and the session
// is left alone.
func (tn *tunnel) watchLogon(bt *browserTransport) {
	if bt.clipIndex.Load() < 0 {
		return
	}
	d := tn.srv.cfg.BrowserLogonTimeout.D()
	time.AfterFunc(d, func() {
		if bt.loggedOn.Load() || tn.relayDone.Load() {
			return
		}
		bt.refused.Store(true)
		tn.log.Info("browser session: no logged-on desktop within the logon timeout; ended as a refused logon", "timeout", d.String())
		tn.stop(fmt.Sprintf("no logged-on desktop within %s of the logon (gateway.browser_logon_timeout): taken as a refused user name or password", d))
	})
}
