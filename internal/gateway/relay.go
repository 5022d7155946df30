package gateway

import (
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/deskway/deskway/internal/pollread"
	"github.com/deskway/deskway/internal/proto/tsgu"
)

// Reads from the RDP host start small, so the many idle or interactive
// tunnels stay cheap, and grow to a full data packet when a read fills
// the buffer (a bulk transfer).
const (
	relayBufMin = 2 << 10
	relayBufMax = tsgu.MaxDataLen
)

// relay copies data both ways until either side ends, the tunnel is
// stopped, or a timeout fires. A websocket tunnel goes to one of the
// server's event loops when it has them (see looprelay.go), which finish
// the tunnel when the relay ends, and relay returns errOnLoop at once. Otherwise the client-to-host direction runs on the
// tunnel's own goroutine and host-to-client on one more. Keepalives and
// timeouts run from a timer either way.
func (tn *tunnel) relay() error {
	up := tn.upstream
	tn.lastInput.Store(time.Now().UnixNano())
	if loops := tn.srv.loops; loops != nil {
		if tn.relayOnLoop(loops) {
			return errOnLoop
		}
	}
	hostDone := make(chan error, 1)
	go func() {
		err := tn.hostToClient()
		tn.stop("") // the client side cannot outlive the host side
		hostDone <- err
	}()
	tn.watch()
	cerr := tn.clientToHost()
	tn.relayDone.Store(true)
	if w := tn.watchdog.Load(); w != nil {
		w.Stop()
	}
	up.Close()
	tn.t.close()
	herr := <-hostDone
	for _, err := range []error{cerr, herr} {
		if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
			return err
		}
	}
	return nil
}

// watch schedules the next keepalive and timeout check of a tunnel no
// event loop relays (a loop's watchdog checks its own tunnels).
func (tn *tunnel) watch() {
	if tn.relayDone.Load() {
		return
	}
	keep := tn.srv.cfg.Keepalive.D()
	tn.watchdog.Store(time.AfterFunc(watchInterval(keep), func() {
		if tn.check(keep) {
			tn.watch()
		}
	}))
}

// watchInterval is how often a tunnel is checked for keepalives and
// timeouts.
func watchInterval(keep time.Duration) time.Duration { return min(keep, 5*time.Second) }

// Status codes of a tunnel the gateway ends. MS-TSGU names one timeout
// status (E_PROXY_SESSIONTIMEOUT), which the session timeout sends; the
// idle timeout sends HRESULT_FROM_WIN32(ERROR_TIMEOUT) so a client can
// tell the two apart; an administrator's or shutdown's disconnect sends
// E_PROXY_CONNECTIONABORTED.
const (
	statusIdleTimeout    tsgu.HRESULT = 0x800705B4
	statusSessionTimeout              = tsgu.EProxySessionTimeout
	statusAborted                     = tsgu.EProxyConnectionAborted
)

// check sends a keepalive or stops the tunnel for a timeout when one is
// due; it reports whether the tunnel is to be checked again.
func (tn *tunnel) check(keep time.Duration) bool {
	if tn.relayDone.Load() {
		return false
	}
	now := time.Now()
	g := tn.grant
	switch {
	case g.IdleTimeout > 0 && now.Sub(time.Unix(0, tn.lastInput.Load())) > g.IdleTimeout:
		tn.stopFor(fmt.Sprintf("no input from the client for more than %s (idle timeout)", g.IdleTimeout), statusIdleTimeout)
		return false
	case g.SessionTimeout > 0 && now.After(tn.started.Add(g.SessionTimeout)):
		tn.stopFor(fmt.Sprintf("session longer than %s (session timeout)", g.SessionTimeout), statusSessionTimeout)
		return false
	}
	if r := tn.onLoop.Load(); r != nil {
		if side, d := r.stalled(now); side != "" {
			tn.stop(fmt.Sprintf("%s took no data for %s (write timeout)", side, d.Round(time.Millisecond)))
			return false
		}
	}
	if now.Sub(time.Unix(0, tn.lastSend.Load())) >= keep {
		if err := tn.send(&tsgu.Keepalive{}); err != nil {
			tn.stop(tn.writeFailure("client", err))
			return false
		}
	}
	return true
}

// writeFailure says why a write to side ("client" or "host") failed,
// naming the write timeout when that is what ended it.
func (tn *tunnel) writeFailure(side string, err error) string {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Sprintf("%s took no data for %s (write timeout)", side, tn.srv.cfg.WriteTimeout.D())
	}
	return fmt.Sprintf("%s write: %v", side, err)
}

// closeChannel tells the client, from the tunnel's own goroutines, that
// the gateway is closing the channel and why.
func (tn *tunnel) closeChannel(code tsgu.HRESULT, reason string) {
	tn.reasonf("%s", reason)
	_ = tn.send(&tsgu.CloseChannel{StatusCode: code})
}

func (tn *tunnel) clientToHost() error {
	wto := tn.srv.cfg.WriteTimeout.D()
	write := func(p []byte) error {
		_ = tn.upstream.SetWriteDeadline(time.Now().Add(wto))
		_, err := tn.upstream.Write(p)
		return err
	}
	for {
		pkt, err := tn.t.readPacket()
		if err != nil {
			return tn.clientReadErr(err)
		}
		if err := tn.fromClient(pkt, write); err != nil {
			return err
		}
	}
}

// clientReadErr records why reading the client ended.
func (tn *tunnel) clientReadErr(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		tn.reasonf("client closed the connection")
		return io.EOF
	}
	tn.reasonf("client read: %v", err)
	return err
}

// fromClient acts on one packet from the client on an open channel,
// passing data to write; an error (io.EOF for a clean close) ends the
// tunnel.
func (tn *tunnel) fromClient(pkt []byte, write func([]byte) error) error {
	m := tn.srv.metrics
	h, _ := tsgu.ParseHeader(pkt)
	switch h.Type {
	case tsgu.TypeData:
		start := time.Now()
		var d tsgu.Data
		if err := d.Decode(pkt[tsgu.HeaderLen:]); err != nil {
			tn.log.Warn("malformed data packet", "err", err)
			tn.closeChannel(tsgu.EBadArguments, "malformed data packet")
			return err
		}
		if err := write(d.Payload); err != nil {
			tn.reasonf("%s", tn.writeFailure("host", err))
			return err
		}
		n := uint64(len(d.Payload))
		tn.bytesUp.Add(n)
		m.bytesUp.Add(float64(n))
		m.latencyUp.Observe(time.Since(start).Seconds())
		tn.lastInput.Store(start.UnixNano())
	case tsgu.TypeKeepalive:
	case tsgu.TypeCloseChannel:
		tn.reasonf("client closed the channel")
		_ = tn.send(&tsgu.CloseChannelResponse{StatusCode: tsgu.SOK})
		return io.EOF
	case tsgu.TypeCloseChannelResponse:
		return io.EOF
	default:
		tn.log.Warn("unexpected packet on open channel", "packet", h.Type.String())
		tn.closeChannel(tsgu.EAccessDenied, "unexpected "+h.Type.String()+" on open channel")
		return fmt.Errorf("gateway: unexpected %s on open channel", h.Type)
	}
	return nil
}

// sentDown accounts for n bytes relayed to the client, written from start.
func (tn *tunnel) sentDown(n int, start time.Time) {
	m := tn.srv.metrics
	tn.bytesDown.Add(uint64(n))
	m.bytesDown.Add(float64(n))
	m.latencyDown.Observe(time.Since(start).Seconds())
	tn.lastSend.Store(start.UnixNano())
}

func (tn *tunnel) hostToClient() error {
	frame := make([]byte, headroom+relayBufMin)
	err := pollread.Pump(tn.upstream, frame[headroom:], func(p []byte) ([]byte, error) {
		n := len(p)
		start := time.Now()
		if err := tn.t.writeData(frame, n); err != nil {
			return nil, errClientWrite{err}
		}
		tn.sentDown(n, start)
		if n == len(frame)-headroom && n < relayBufMax {
			frame = make([]byte, headroom+min(4*n, relayBufMax))
		}
		return frame[headroom:], nil
	})
	var cw errClientWrite
	switch {
	case errors.As(err, &cw):
		tn.reasonf("%s", tn.writeFailure("client", cw.err))
		return cw.err
	case errors.Is(err, io.EOF):
		tn.closeChannel(tsgu.SOK, "host closed the connection")
	default:
		tn.reasonf("host read: %v", err)
	}
	return err
}

// errClientWrite marks a failed write to the client inside the host read
// loop, which is not a host read error.
type errClientWrite struct{ err error }

func (e errClientWrite) Error() string { return e.err.Error() }
func (e errClientWrite) Unwrap() error { return e.err }
