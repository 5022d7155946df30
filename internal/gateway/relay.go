package gateway

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/deskway/deskway/internal/proto/tsgu"
)

// relayBuf is the size of one read from the RDP host; RDP's own PDUs fit.
const relayBuf = 16 << 10

// relay copies data both ways until either side ends, the tunnel is
// stopped, or a timeout fires. It also sends keepalives when the client
// has heard nothing for a keepalive interval.
func (tn *tunnel) relay() error {
	up := tn.upstream
	defer up.Close()
	tn.lastActivity.Store(time.Now().UnixNano())
	errc := make(chan error, 2)
	go func() { errc <- tn.clientToHost() }()
	go func() { errc <- tn.hostToClient() }()

	keep := tn.srv.cfg.Keepalive.D()
	tick := time.NewTicker(min(keep, time.Second*5))
	defer tick.Stop()
	sessionEnd := tn.started.Add(tn.grant.SessionTimeout)
	var err error
	for done := false; !done; {
		select {
		case err = <-errc:
			done = true
		case <-tn.stopped:
			done = true
		case now := <-tick.C:
			switch {
			case tn.grant.IdleTimeout > 0 && now.Sub(time.Unix(0, tn.lastActivity.Load())) > tn.grant.IdleTimeout:
				tn.closeChannel(tsgu.EProxySessionTimeout, fmt.Sprintf("idle for more than %s", tn.grant.IdleTimeout))
				done = true
			case tn.grant.SessionTimeout > 0 && now.After(sessionEnd):
				tn.closeChannel(tsgu.EProxySessionTimeout, fmt.Sprintf("session longer than %s", tn.grant.SessionTimeout))
				done = true
			case now.Sub(time.Unix(0, tn.lastSend.Load())) >= keep:
				if err := tn.send(&tsgu.Keepalive{}); err != nil {
					done = true
				}
			}
		}
	}
	// Closing both ends unblocks whichever direction is still running.
	up.Close()
	tn.t.close()
	if e := <-errc; err == nil {
		err = e
	}
	if err == nil {
		<-errc
	}
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// closeChannel tells the client the gateway is closing the channel and why.
func (tn *tunnel) closeChannel(code tsgu.HRESULT, reason string) {
	tn.reasonf("%s", reason)
	_ = tn.send(&tsgu.CloseChannel{StatusCode: code})
}

func (tn *tunnel) clientToHost() error {
	up := tn.upstream
	m := tn.srv.metrics
	for {
		pkt, err := tn.t.readPacket()
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				tn.reasonf("client closed the connection")
				return io.EOF
			}
			tn.reasonf("client read: %v", err)
			return err
		}
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
			if _, err := up.Write(d.Payload); err != nil {
				tn.reasonf("host write: %v", err)
				return err
			}
			n := uint64(len(d.Payload))
			tn.bytesUp.Add(n)
			m.bytesUp.Add(float64(n))
			m.latencyUp.Observe(time.Since(start).Seconds())
			tn.lastActivity.Store(start.UnixNano())
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
	}
}

func (tn *tunnel) hostToClient() error {
	up := tn.upstream
	m := tn.srv.metrics
	buf := make([]byte, headroom+relayBuf)
	for {
		n, err := up.Read(buf[headroom:])
		if n > 0 {
			start := time.Now()
			if werr := tn.t.writeData(buf, n); werr != nil {
				return werr
			}
			tn.bytesDown.Add(uint64(n))
			m.bytesDown.Add(float64(n))
			m.latencyDown.Observe(time.Since(start).Seconds())
			tn.lastActivity.Store(start.UnixNano())
			tn.lastSend.Store(start.UnixNano())
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				tn.closeChannel(tsgu.SOK, "host closed the connection")
			} else {
				tn.reasonf("host read: %v", err)
			}
			return err
		}
	}
}
