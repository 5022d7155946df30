package gateway

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"

	"github.com/deskway/deskway/internal/policy"
	"github.com/deskway/deskway/internal/proto/cliprdr"
	"github.com/deskway/deskway/internal/proto/rdcleanpath"
	"github.com/deskway/deskway/internal/proto/sharecontrol"
	"github.com/deskway/deskway/internal/proto/tsgu"
	"github.com/deskway/deskway/internal/proto/x224"
)

// browserPath is where browser clients open their websocket.
const browserPath = "/rdp"

// maxBrowserRequest bounds the RDCleanPath request read before the
// client is authenticated: a token, a host name and a Connection Request
// fit many times over.
const maxBrowserRequest = 16 << 10

// A browser session is a tunnel like any other (the same token, policies,
// caps, timeouts, admin listing and disconnect), but its client speaks
// RDCleanPath over a websocket instead of MS-TSGU: the browser sends its
// token, the host and its X.224 Connection Request; the gateway connects,
// does TLS with the host itself, since a browser cannot, and answers with
// the host's Connection Confirm and certificates. Then the websocket
// carries the client's plain RDP, which the gateway relays into its TLS
// session with the host.
func (s *Server) serveBrowser(w http.ResponseWriter, r *http.Request, cs *connState) {
	if len(s.cfg.BrowserOrigins) == 0 {
		plain(w, http.StatusNotFound, "browser sessions are off: list the portal's origin in gateway.browser_origins\n")
		return
	}
	if !s.offers(policy.MethodPAA) || s.deps.Tokens == nil {
		plain(w, http.StatusNotFound, "browser sessions need PAA tokens: add paa to gateway.auth_methods and set auth.token_key\n")
		return
	}
	if s.isClosing() {
		plain(w, http.StatusServiceUnavailable, "")
		return
	}
	hs := handshakeInfo{method: policy.MethodPAA, remote: cs.remote, conns: []*connState{cs}}
	neg, err := negotiateDeflate(r.Header, s.cfg.BrowserCompression)
	if err != nil {
		plain(w, http.StatusBadRequest, "websocket extensions cannot be read\n")
		s.log.Info("browser websocket refused", "remote", cs.remote.String(), "err", err)
		return
	}
	var extra string
	if neg.header != "" {
		extra = "Sec-WebSocket-Extensions: " + neg.header + "\r\n"
	}
	conn, in, ok := s.upgrade(w, r, hs, extra)
	if !ok {
		return
	}
	bt := &browserTransport{wsTransport: newWSTransport(conn, cs.raw, in, s.cfg.WriteTimeout.D())}
	if neg.header != "" {
		if bt.deflate, err = newDeflater(neg.context); err != nil {
			s.log.Error("browser websocket", "err", err)
			_ = cs.raw.Close()
			cs.finish()
			return
		}
		bt.in.inflate = &inflater{}
	}
	layout, err := keyboardLayout(r.URL.Query())
	if err != nil {
		s.log.Warn("browser session: the host's default keyboard layout is used", "remote", cs.remote, "err", err)
	}
	bt.layout = layout
	bt.clipIndex.Store(-1)
	origin := r.Header.Get("Origin")
	s.runWith(bt, hs, "browser", func(tn *tunnel) error {
		if neg.header != "" {
			tn.log = tn.log.With("permessage_deflate", neg.header)
		}
		// The gateway's own reasons for ending it reach the page.
		tn.clientCaps = tsgu.CapMessagingServiceMsg
		return tn.runBrowser(bt, origin)
	})
}

// browserTransport is a browser session's websocket. It carries no
// MS-TSGU, so what the tunnel's common code sends in MS-TSGU is turned
// into websocket terms: a keepalive becomes a ping, and the service
// message with which the gateway ends a session (an administrator, a
// timeout, shutdown) becomes the reason in the close frame. Other ends
// carry no reason: their errors name the gateway's own addresses.
type browserTransport struct {
	*wsTransport
	// deflate compresses what is sent when the browser negotiated
	// permessage-deflate.
	deflate *deflater
	// sent counts the bytes of the messages' payloads sent, after
	// compression: what reaches the browser.
	sent   atomic.Uint64
	layout uint32 // the page's keyboard layout, 0 for none (see keyboardParam)
	// clipIndex is the clipboard channel's place among those the client
	// asks for, -1 for none: the client's side writes it, the host's
	// reads it to find the channel's id.
	clipIndex atomic.Int32
	// loggedOn is set once the host shows a logged-on desktop (see
	// watchLogon); refused once the gateway ends the session for want of
	// one, which the close frame tells the page.
	loggedOn, refused atomic.Bool
}

// closeLogonRefused is the websocket close code (one of those RFC 6455
// leaves to applications) with which the gateway tells the page that
// the desktop refused the logon: the page asks for the password again.
const closeLogonRefused = 4401

// writePacket sends a ping: the only packet the common code sends once a
// browser session is open is a keepalive.
func (t *browserTransport) writePacket([]byte) error { return t.writeControl(ws.OpPing, nil) }

func (t *browserTransport) close(final ...[]byte) {
	t.g.shut(func() {
		msg := []byte{0x03, 0xe8} // 1000 normal closure
		if t.refused.Load() {
			msg = append(binary.BigEndian.AppendUint16(nil, closeLogonRefused), "logon refused"...)
		}
		for _, p := range final {
			if m, err := tsgu.Decode(p); err == nil {
				if sm, ok := m.(*tsgu.ServiceMessage); ok {
					// A close frame's payload is at most 125 bytes.
					msg = append(msg, truncateUTF8(sm.Message, 123)...)
				}
			}
		}
		_ = t.writeFrameLocked(ws.OpClose, msg)
	})
	_ = t.raw.Close()
}

func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xc0 == 0x80 {
		n--
	}
	return s[:n]
}

// readRequest reads the client's RDCleanPath request off the websocket.
func (t *browserTransport) readRequest() (*rdcleanpath.PDU, error) {
	buf := make([]byte, 2, 64)
	if _, err := io.ReadFull(&t.in, buf); err != nil {
		return nil, err
	}
	n, err := rdcleanpath.Len(buf, maxBrowserRequest)
	if errors.Is(err, rdcleanpath.ErrShort) {
		buf = append(buf, make([]byte, int(buf[1]&0x7f))...)
		if _, err := io.ReadFull(&t.in, buf[2:]); err != nil {
			return nil, err
		}
		n, err = rdcleanpath.Len(buf, maxBrowserRequest)
	}
	if err != nil {
		return nil, err
	}
	have := len(buf)
	buf = append(buf, make([]byte, n-have)...)
	if _, err := io.ReadFull(&t.in, buf[have:]); err != nil {
		return nil, err
	}
	return rdcleanpath.Decode(buf)
}

// httpStatusFor is what a browser is told of a refusal: IronRDP's client
// shows the HTTP status, and the portal's page says what it means.
func httpStatusFor(code tsgu.HRESULT) uint16 {
	switch code {
	case tsgu.EProxyCookieAuthenticationDenied, tsgu.EProxyCookieBadPacket:
		return http.StatusUnauthorized
	case tsgu.EProxyNAPAccessDenied, tsgu.EProxyRAPAccessDenied, tsgu.EAccessDenied:
		return http.StatusForbidden
	case tsgu.EProxyMaxConnectionsReached:
		return http.StatusServiceUnavailable
	case tsgu.EProxyTSConnectFailed:
		return http.StatusBadGateway
	case tsgu.EProxySessionTimeout:
		return http.StatusRequestTimeout
	case tsgu.EBadArguments:
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

// refuseBrowser logs a refusal and sends the browser its error PDU.
func (tn *tunnel) refuseBrowser(bt *browserTransport, r *refusal, pdu *rdcleanpath.PDU) error {
	tn.reasonf("%s", r.reason)
	level := slog.LevelInfo
	if r.code == tsgu.EBadArguments || r.code == tsgu.EAccessDenied {
		level = slog.LevelWarn
	}
	if pdu == nil {
		pdu = rdcleanpath.HTTPError(httpStatusFor(r.code))
	}
	tn.log.Log(context.Background(), level, "browser session refused", "status", r.code.String(), "reason", r.reason)
	if b, err := pdu.Append(nil); err == nil {
		_ = bt.writeBinary(b)
	}
	return r
}

// runBrowser admits a browser session and relays it.
func (tn *tunnel) runBrowser(bt *browserTransport, origin string) error {
	s := tn.srv
	_ = bt.setReadDeadline(tn.hs.deadline())
	bad := func(code tsgu.HRESULT, format string, a ...any) error {
		return tn.refuseBrowser(bt, &refusal{tsgu.TypeTunnelCreate, code, fmt.Sprintf(format, a...)}, nil)
	}
	// The request is read (within the limits of any unauthenticated
	// client) before the origin is judged, so that the browser is still
	// listening when it is told; nothing in it is acted on first.
	req, err := bt.readRequest()
	if !slices.Contains(s.cfg.BrowserOrigins, origin) {
		// A page of another site must not use a user's browser, and the
		// token the user holds, to reach a host.
		return bad(tsgu.EAccessDenied, "origin %q may not open browser sessions (gateway.browser_origins)", origin)
	}
	if lk := s.deps.Throttle.Check("", tn.hs.remote); lk != nil {
		s.metrics.auth.WithLabelValues(policy.MethodPAA, "throttled").Inc()
		return tn.refuseBrowser(bt, &refusal{tsgu.TypeTunnelCreate, tsgu.EProxyCookieAuthenticationDenied, "failed-login throttle: " + lk.Reason},
			rdcleanpath.HTTPError(http.StatusTooManyRequests))
	}
	if err != nil {
		if tn.budgetSpent() {
			tn.reasonf("no session open within the handshake budget of %s", s.cfg.HandshakeTimeout.D())
			return err
		}
		return bad(tsgu.EBadArguments, "RDCleanPath request: %v", err)
	}
	if req.Version != rdcleanpath.Version {
		return bad(tsgu.EBadArguments, "RDCleanPath version %d, want %d", req.Version, rdcleanpath.Version)
	}
	name, port, err := splitDestination(req.Destination)
	if err != nil {
		return bad(tsgu.EBadArguments, "destination: %v", err)
	}
	cr, err := x224.ParseConnectionRequest(req.X224)
	if err != nil {
		return bad(tsgu.EBadArguments, "%v", err)
	}
	if cr.Protocols&(x224.ProtocolSSL|x224.ProtocolHybrid|x224.ProtocolHybridEx) == 0 {
		return bad(tsgu.EBadArguments, "the client offers no TLS (requested protocols %#x)", cr.Protocols)
	}
	tn.clientName = "browser"
	if err := tn.authorize(tsgu.TypeTunnelCreate, &req.ProxyAuth); err != nil {
		return tn.browserErr(bt, err)
	}
	if err := tn.connect(tsgu.TypeChannelCreate, []string{name}, port); err != nil {
		return tn.browserErr(bt, err)
	}
	host := tn.upstream
	_ = host.SetDeadline(tn.hs.deadline())
	if req.PreconnectionBlob != "" {
		if _, err := host.Write([]byte(req.PreconnectionBlob)); err != nil {
			return bad(tsgu.EProxyTSConnectFailed, "host %s: preconnection blob: %v", tn.target.Addr, err)
		}
	}
	if _, err := host.Write(req.X224); err != nil {
		return bad(tsgu.EProxyTSConnectFailed, "host %s: connection request: %v", tn.target.Addr, err)
	}
	confirm, err := readTPKT(host)
	if err != nil {
		return bad(tsgu.EProxyTSConnectFailed, "host %s: connection confirm: %v", tn.target.Addr, err)
	}
	cc, err := x224.ParseConnectionConfirm(confirm)
	switch {
	case err != nil:
		return bad(tsgu.EProxyTSConnectFailed, "host %s: %v", tn.target.Addr, err)
	case cc.Failure != 0:
		// The client reads the host's own refusal (NLA required, say).
		return tn.refuseBrowser(bt, &refusal{tsgu.TypeChannelCreate, tsgu.EProxyTSConnectFailed, fmt.Sprintf("host %s refused the client's security protocols (RDP_NEG_FAILURE %d)", tn.target.Addr, cc.Failure)},
			&rdcleanpath.PDU{Version: rdcleanpath.Version, Error: &rdcleanpath.Error{Code: rdcleanpath.NegotiationError}, X224: confirm})
	case cc.Protocol == x224.ProtocolRDP:
		return bad(tsgu.EProxyTSConnectFailed, "host %s offers no TLS, which browser sessions need", tn.target.Addr)
	}
	tg := tn.target
	tc := tls.Client(host, &tls.Config{
		ServerName: tlsServerName(tg.Name),
		MinVersion: tls.VersionTLS12,
		// The policy's check replaces the system's: InsecureSkipVerify
		// only hands verification to VerifyConnection.
		InsecureSkipVerify: true,
		VerifyConnection:   func(st tls.ConnectionState) error { return tg.Cert.Verify(tg.Name, st.PeerCertificates) },
	})
	ctx, cancel := context.WithDeadline(context.Background(), tn.hs.deadline())
	err = tc.HandshakeContext(ctx)
	cancel()
	if err != nil {
		return bad(tsgu.EProxyTSConnectFailed, "TLS with host %s: %v", tg.Addr, err)
	}
	var chain [][]byte
	for _, c := range tc.ConnectionState().PeerCertificates {
		chain = append(chain, c.Raw)
	}
	resp, err := rdcleanpath.Response(confirm, chain, tg.Addr.String()).Append(nil)
	if err != nil {
		return bad(tsgu.EProxyInternalError, "%v", err)
	}
	tn.open.Store(true)
	if err := bt.writeBinary(resp); err != nil {
		return err
	}
	tn.opened()
	_ = bt.setReadDeadline(time.Time{})
	_ = host.SetDeadline(time.Time{})
	return tn.relayBrowser(bt, tc)
}

// browserErr sends the browser a refusal from authorize or connect.
func (tn *tunnel) browserErr(bt *browserTransport, err error) error {
	var r *refusal
	if errors.As(err, &r) {
		return tn.refuseBrowser(bt, r, nil)
	}
	return err
}

// splitDestination reads "host[:port]"; the port defaults to RDP's.
func splitDestination(d string) (string, uint16, error) {
	if d == "" {
		return "", 0, errors.New("missing")
	}
	host, ps, err := net.SplitHostPort(d)
	if err != nil {
		// No port: a bare name or address, IPv6 possibly in brackets.
		host, ps = d, "3389"
		if len(d) > 1 && d[0] == '[' && d[len(d)-1] == ']' {
			host = d[1 : len(d)-1]
		}
	}
	p, err := strconv.ParseUint(ps, 10, 16)
	if err != nil || p == 0 || host == "" {
		return "", 0, fmt.Errorf("%q is not host:port", d)
	}
	return host, uint16(p), nil
}

// tlsServerName is the SNI to send: none for an address.
func tlsServerName(name string) string {
	if net.ParseIP(name) != nil {
		return ""
	}
	return name
}

// readTPKT reads one TPKT packet of at most 1 KiB: a Connection Confirm
// is 19 bytes.
func readTPKT(r io.Reader) ([]byte, error) {
	hdr := make([]byte, x224.TPKTHeaderLen, 64)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return nil, err
	}
	n, err := x224.TPKTLen(hdr)
	if err != nil {
		return nil, err
	}
	if n > 1024 {
		return nil, fmt.Errorf("TPKT of %d bytes where a connection confirm was due", n)
	}
	pkt := append(hdr, make([]byte, n-x224.TPKTHeaderLen)...)
	if _, err := io.ReadFull(r, pkt[x224.TPKTHeaderLen:]); err != nil {
		return nil, err
	}
	return pkt, nil
}

// relayBrowser copies the browser's RDP into the host's TLS session and
// back until either side ends, the tunnel is stopped or a timeout fires.
func (tn *tunnel) relayBrowser(bt *browserTransport, host *tls.Conn) error {
	tn.lastInput.Store(time.Now().UnixNano())
	hostDone := make(chan error, 1)
	go func() {
		err := tn.hostToBrowser(bt, host)
		tn.stop("")
		hostDone <- err
	}()
	tn.watch()
	cerr := tn.browserToHost(bt, host)
	tn.relayDone.Store(true)
	if w := tn.watchdog.Load(); w != nil {
		w.Stop()
	}
	tn.closeHost()
	bt.close()
	herr := <-hostDone
	for _, err := range []error{cerr, herr} {
		if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
			return err
		}
	}
	return nil
}

func (tn *tunnel) hostToBrowser(bt *browserTransport, host *tls.Conn) error {
	buf := make([]byte, 16<<10) // one TLS record's worth
	out := outputFramer{clipIndex: &bt.clipIndex}
	for {
		n, err := host.Read(buf)
		if n > 0 {
			tn.bytesDown.Add(uint64(n))
			pdus, ferr := out.feed(buf[:n])
			if ferr != nil {
				tn.log.Warn("host output not understood; passing it on as it is", "err", ferr)
			}
			for _, ev := range out.events {
				switch ev {
				case sharecontrol.Began, sharecontrol.Completed:
					tn.log.Debug("host deactivated the session to reactivate it (a resize); holding its output until the client has finalized", "short_deactivate_completed", ev == sharecontrol.Completed)
				case sharecontrol.Finished:
					tn.log.Debug("session reactivated")
				case sharecontrol.Overflowed:
					tn.log.Warn("host sent more output while reactivating the session than the gateway holds; passed on without waiting for the client", "max_held", sharecontrol.DefaultMaxHeld)
				}
			}
			if out.clip.Active() && !bt.loggedOn.Load() {
				bt.loggedOn.Store(true)
				tn.log.Debug("host's channel server speaks on the clipboard channel: the desktop is logged on")
			}
			for _, ev := range out.clipEvents {
				switch ev {
				case cliprdr.Held:
					tn.log.Debug("host offered its clipboard before the client's clipboard channel was ready; holding the offer until it is")
				case cliprdr.Released:
					tn.log.Debug("client's clipboard channel ready; held clipboard offers passed on")
				case cliprdr.Overflowed:
					tn.log.Warn("host kept offering its clipboard while the client's clipboard channel was not ready; offers passed on without waiting")
				}
			}
			if len(pdus) > 0 {
				if werr := bt.writeBinary(pdus); werr != nil {
					tn.reasonf("%s", tn.writeFailure("client", werr))
					return werr
				}
				tn.lastSend.Store(time.Now().UnixNano())
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				tn.reasonf("host closed the connection")
			} else {
				tn.reasonf("host read: %v", err)
			}
			return err
		}
	}
}

func (tn *tunnel) browserToHost(bt *browserTransport, host *tls.Conn) error {
	wto := tn.srv.cfg.WriteTimeout.D()
	buf := make([]byte, 16<<10)
	logon := logonWatch{withhold: withheldChannels(tn.grant.RedirFlags), creds: tn.desktopCredentials(), layout: bt.layout, clipIndex: &bt.clipIndex}
	for {
		n, err := bt.in.Read(buf)
		if n > 0 {
			tn.lastInput.Store(time.Now().UnixNano())
			tn.bytesUp.Add(uint64(n))
			out, ferr := logon.feed(buf[:n])
			if ferr != nil {
				tn.reasonf("client's connection sequence: %v", ferr)
				return ferr
			}
			if logon.set {
				logon.set = false
				if logon.creds != nil {
					tn.log.Info("desktop account's credentials put in the client info", "account", logon.creds.User)
				} else {
					tn.log.Debug("auto-logon turned on in the client info")
				}
				tn.watchLogon(bt)
			}
			if logon.raised {
				logon.raised = false
				tn.log.Debug("client build raised in the connect initial", "build", browserClientBuild)
			}
			if logon.keyboard {
				logon.keyboard = false
				tn.log.Debug("keyboard layout set in the connect initial", "layout", fmt.Sprintf("%#04x", bt.layout))
			}
			if logon.withheld > 0 {
				tn.log.Info("channels withheld by the connection policy", "channels", logon.withhold, "policy", tn.grant.Policy)
				logon.withheld = 0
			}
			if len(out) > 0 {
				_ = host.SetWriteDeadline(time.Now().Add(wto))
				if _, werr := host.Write(out); werr != nil {
					tn.reasonf("%s", tn.writeFailure("host", werr))
					return werr
				}
			}
		}
		if err != nil {
			return tn.clientReadErr(err)
		}
	}
}
