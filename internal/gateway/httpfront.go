package gateway

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha1"
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strings"
	"time"

	"github.com/deskway/deskway/internal/auth"
)

// handshakeInfo is what the HTTP layer learned before the tunnel starts.
type handshakeInfo struct {
	user   *auth.User // nil for PAA
	method string
	remote netip.Addr
	connID string
	// conns are the tunnel's connections (two for the legacy pair), whose
	// pre-authentication phase ends when the channel opens.
	conns []*connState
	// onOpen, if set, is called once the channel has opened: an IN half
	// carried from a farm peer tells that peer.
	onOpen func()
	// began is when the request that starts the tunnel reached the
	// handler.
	began time.Time
}

// answered adds the time since the request began to its connection's
// served time: call it once the response is written.
func (h handshakeInfo) answered() {
	if !h.began.IsZero() && len(h.conns) > 0 {
		h.conns[0].served.Add(int64(time.Since(h.began)))
	}
}

// httpServed is the gateway's time answering the tunnel's connections'
// RDG requests.
func (h handshakeInfo) httpServed() time.Duration {
	var d time.Duration
	for _, c := range h.conns {
		d += time.Duration(c.served.Load())
	}
	return d
}

// deadline is when the first of the connections' budgets runs out.
func (h handshakeInfo) deadline() time.Time {
	var d time.Time
	for _, c := range h.conns {
		if d.IsZero() || c.deadline.Before(d) {
			d = c.deadline
		}
	}
	return d
}

// serveWebsocket upgrades RDG_OUT_DATA. xfreerdp 2.11 sends a 15-character
// Sec-WebSocket-Key that is not base64, so any non-empty key is accepted and
// the accept value is computed from it exactly as sent.
func (s *Server) serveWebsocket(w http.ResponseWriter, r *http.Request, hs handshakeInfo) {
	conn, in, ok := s.upgrade(w, r, hs, "")
	if !ok {
		return
	}
	s.runTunnel(newWSTransport(conn, hs.conns[0].raw, in, s.cfg.WriteTimeout.D()), hs, "websocket")
}

// upgrade answers a websocket upgrade request with 101 and hands back the
// connection, and a reader that replays what the client pipelined behind
// its request. It has answered the client itself when it returns false.
// extra holds further header lines for the response, each ending in CRLF.
func (s *Server) upgrade(w http.ResponseWriter, r *http.Request, hs handshakeInfo, extra string) (net.Conn, io.Reader, bool) {
	key := r.Header.Get("Sec-WebSocket-Key")
	if key == "" || !headerHasToken(r.Header, "Connection", "upgrade") {
		plain(w, http.StatusBadRequest, "websocket upgrade needs Connection: Upgrade and Sec-WebSocket-Key\n")
		return nil, nil, false
	}
	if v := r.Header.Get("Sec-WebSocket-Version"); v != "" && v != "13" {
		w.Header().Set("Sec-WebSocket-Version", "13")
		plain(w, http.StatusUpgradeRequired, "")
		return nil, nil, false
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		s.log.Error("websocket hijack", "err", err)
		return nil, nil, false
	}
	sum := sha1.Sum([]byte(key + websocketGUID))
	resp := "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " +
		base64.StdEncoding.EncodeToString(sum[:]) + "\r\n" + extra + "\r\n"
	_ = conn.SetReadDeadline(hs.deadline())
	_ = conn.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout.D()))
	if _, err := conn.Write([]byte(resp)); err != nil {
		conn.Close()
		hs.conns[0].finish()
		return nil, nil, false
	}
	hs.answered()
	// Drop net/http's 4 KiB read buffer: tls.Conn buffers a record already.
	// Bytes the client pipelined behind its request are replayed first.
	var in io.Reader = conn
	if n := brw.Reader.Buffered(); n > 0 {
		pre, _ := brw.Reader.Peek(n)
		in = io.MultiReader(bytes.NewReader(bytes.Clone(pre)), conn)
	}
	return conn, in, true
}

func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// pendingOut is a legacy OUT half waiting for its IN half, which must
// come before the OUT half's pre-authentication budget runs out.
type pendingOut struct {
	conn  net.Conn
	hs    handshakeInfo
	timer *time.Timer
}

func (p *pendingOut) abandon() {
	p.timer.Stop()
	_ = p.hs.conns[0].raw.Close()
	p.hs.conns[0].finish()
}

// serveLegacyOut answers RDG_OUT_DATA with 200 and a 10-byte seed, HTTP/1.0
// style without a length, then waits for the IN half with the same id.
func (s *Server) serveLegacyOut(w http.ResponseWriter, r *http.Request, hs handshakeInfo) {
	if hs.connID == "" || len(hs.connID) > 128 {
		plain(w, http.StatusBadRequest, "RDG-Connection-Id header missing or too long\n")
		return
	}
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		s.log.Error("legacy out hijack", "err", err)
		return
	}
	_ = conn.SetReadDeadline(time.Time{})
	_ = conn.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout.D()))
	p := &pendingOut{conn: conn, hs: hs}
	s.mu.Lock()
	if _, dup := s.pending[hs.connID]; dup || s.closing {
		s.mu.Unlock()
		s.log.Warn("second RDG_OUT_DATA for a connection id", "remote", hs.remote)
		_, _ = conn.Write([]byte("HTTP/1.1 409 Conflict\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"))
		_ = hs.conns[0].raw.Close()
		hs.conns[0].finish()
		return
	}
	s.pending[hs.connID] = p
	// The budget closes the connection; this takes the half off the list.
	p.timer = time.AfterFunc(time.Until(hs.deadline()), func() {
		s.mu.Lock()
		mine := s.pending[hs.connID] == p
		if mine {
			delete(s.pending, hs.connID)
		}
		s.mu.Unlock()
		if mine {
			s.log.Warn("RDG_OUT_DATA never joined by RDG_IN_DATA", "remote", hs.remote)
			p.abandon()
		}
	})
	s.mu.Unlock()
	seed := make([]byte, 10)
	_, _ = rand.Read(seed)
	resp := "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nCache-Control: no-cache\r\n\r\n"
	_, _ = conn.Write(append([]byte(resp), seed...)) // a failure shows when the tunnel writes
	hs.answered()

	// The IN half's goroutine runs the tunnel; this one is done.
}

// serveLegacyIn answers the body-less RDG_IN_DATA with 200, and runs the
// tunnel on the chunked one, after pairing it with its OUT half.
func (s *Server) serveLegacyIn(w http.ResponseWriter, r *http.Request, hs handshakeInfo) {
	chunked := len(r.TransferEncoding) > 0 && r.TransferEncoding[0] == "chunked"
	if !chunked && r.ContentLength <= 0 {
		plain(w, http.StatusOK, "")
		return
	}
	if !validConnID(hs.connID) {
		plain(w, http.StatusBadRequest, "RDG-Connection-Id header missing, too long or not a GUID\n")
		return
	}
	var user string
	if hs.user != nil {
		user = hs.user.Name
	}
	s.mu.Lock()
	p, ok := s.pending[hs.connID]
	why := "no RDG_OUT_DATA with this connection id is waiting"
	if ok {
		why = pairRefusal(p, hs.method, user, hs.remote)
		if why == "" {
			delete(s.pending, hs.connID)
			p.timer.Stop()
		}
	}
	s.mu.Unlock()
	if why != "" && len(s.cfg.FarmPeers) > 0 {
		// Behind a load balancer with no stickiness, the OUT half may have
		// reached another node of the farm; so it may when a half here
		// holds the id but may not be joined (someone else's).
		peer, addr, busy := s.claimIn(r.Context(), hs)
		switch {
		case peer != nil:
			s.forwardLegacyIn(w, r, hs, chunked, peer, addr)
			return
		case busy:
			s.refused.Log(s.log, "RDG_IN_DATA refused", hs.remote, "too many farm claims in flight")
			s.metrics.farmIn.WithLabelValues("busy").Inc()
			plain(w, http.StatusServiceUnavailable, "")
			return
		case !ok:
			why = "no RDG_OUT_DATA with this connection id is waiting on this node or its farm peers"
			s.metrics.farmIn.WithLabelValues("not_found").Inc()
		}
	}
	if why != "" {
		s.log.Warn("RDG_IN_DATA refused", "reason", why, "remote", hs.remote)
		plain(w, http.StatusForbidden, "")
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		p.abandon()
		return
	}
	_ = conn.SetDeadline(time.Time{})
	hs.answered() // the IN half is answered by the tunnel's replies on the OUT half
	hs.conns = append(hs.conns, p.hs.conns[0])
	lt := &legacyTransport{in: conn, inRaw: hs.conns[0].raw, out: p.conn, outRaw: p.hs.conns[0].raw,
		g: newWriteGate(p.conn, s.cfg.WriteTimeout.D())}
	lt.pr = packetReader{r: inBody(brw.Reader, chunked, r.ContentLength)}
	s.runTunnel(lt, hs, "legacy")
}

// validConnID: an RDG-Connection-Id as clients make them, a GUID in
// braces or bare; up to 128 characters of its alphabet are accepted.
func validConnID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for _, c := range id {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-' || c == '{' || c == '}') {
			return false
		}
	}
	return true
}

// inBody is the IN half's request body as it comes after the headers.
func inBody(r *bufio.Reader, chunked bool, length int64) io.Reader {
	if chunked {
		return httputil.NewChunkedReader(r)
	}
	return io.LimitReader(r, length)
}

// forwardLegacyIn takes the IN half from net/http and carries it to the
// farm peer that granted its OUT half.
func (s *Server) forwardLegacyIn(w http.ResponseWriter, r *http.Request, hs handshakeInfo, chunked bool, peer net.Conn, addr string) {
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		_ = peer.Close()
		return
	}
	_ = conn.SetDeadline(time.Time{})
	// The connection keeps its handshake budget until the peer says the
	// channel opened (forwardIn).
	s.forwardIn(conn, inBody(brw.Reader, chunked, r.ContentLength), peer, hs, addr)
}
