package gateway

// A farm of gateway nodes behind a load balancer with no stickiness: the
// two halves of a legacy tunnel (RDG_OUT_DATA, RDG_IN_DATA) are separate
// HTTP connections and may reach different nodes. A node that gets an
// IN half without its OUT half asks its peers (gateway.farm_peers) at
// once; the one that holds the OUT half takes the IN half's bytes over a
// node-to-node connection and runs the tunnel as if both halves had
// reached it, under the same pairing rules (same login, one IN per OUT).
// The node that got the IN half only carries its bytes.
//
// The node-to-node connection is TLS to the peer's gateway listener.
// Both ends prove they hold the farm key (derived from the token key
// every node of a farm shares) with an HMAC over the request and the TLS
// session's exported keying material (RFC 5705), so a client cannot pose
// as a node, and no one between the nodes can relay a claim into a TLS
// session of their own or read the IN half. The link needs no PROXY
// header even from a trusted balancer's address (a node on the
// balancer's host): on such a bare connection only the claim is served.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/deskway/deskway/internal/policy"
	"github.com/deskway/deskway/internal/proxylisten"
)

const (
	farmPath    = "/farm/legacy-in"
	farmUpgrade = "deskway-legacy-in"
	// farmSkew is how far a claim's time may be from the receiver's.
	farmSkew = time.Minute
	// farmExporterLabel names the keying material the MACs bind to.
	farmExporterLabel = "EXPORTER-deskway-farm-legacy-in"
)

// FarmKey derives the key farm nodes authenticate each other with from
// the PAA token key they already share.
func FarmKey(tokenKey []byte) []byte {
	m := hmac.New(sha256.New, tokenKey)
	m.Write([]byte("deskway gateway farm v1"))
	return m.Sum(nil)
}

// farmClaim is what a node asks its peers: the OUT half waiting under
// connID, for an IN half that authenticated with method as user (NTLM)
// from remote.
type farmClaim struct {
	connID, method, user, remote string
	at                           int64 // unix seconds
}

// mac is the HMAC of the claim for one direction ("claim" or "grant"),
// bound to the TLS session by its exported keying material ekm.
func (c farmClaim) mac(key, ekm []byte, dir string) string {
	m := hmac.New(sha256.New, key)
	for _, f := range []string{dir, string(ekm), c.connID, c.method, c.user, c.remote, strconv.FormatInt(c.at, 10)} {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(f)))
		m.Write(n[:])
		m.Write([]byte(f))
	}
	return base64.RawStdEncoding.EncodeToString(m.Sum(nil))
}

func farmEKM(cs tls.ConnectionState) ([]byte, error) {
	return cs.ExportKeyingMaterial(farmExporterLabel, nil, 32)
}

const (
	hdrConnID = "Deskway-Farm-Connection-Id"
	hdrMethod = "Deskway-Farm-Method"
	hdrUser   = "Deskway-Farm-User"
	hdrRemote = "Deskway-Farm-Remote"
	hdrTime   = "Deskway-Farm-Time"
	hdrMAC    = "Deskway-Farm-Mac"
)

// pairRefusal says why an IN half that authenticated with method as user
// (NTLM) from remote may not join the waiting OUT half p, or "".
func pairRefusal(p *pendingOut, method, user string, remote netip.Addr) string {
	switch {
	case p.hs.method != method:
		return "IN and OUT halves authenticated differently"
	case method == policy.MethodNTLM && (p.hs.user == nil || user == "" || p.hs.user.Name != user):
		return "IN half authenticated as another user than the OUT half"
	case method == policy.MethodPAA && p.hs.remote != remote:
		return "IN half comes from another address than the OUT half"
	}
	return ""
}

// farmClaimsInFlight and farmClaimsPerAddr bound the claims a node has
// out at once, in all and for IN halves from one client address: an IN
// half needs no credentials (PAA), and each claim costs every peer a TLS
// handshake.
const (
	farmClaimsInFlight = 64
	farmClaimsPerAddr  = 4
)

// claimIn asks every farm peer for the OUT half of hs's connection and
// returns the connection to the one that holds it, ready to take the IN
// half's bytes. It returns nil when no peer holds it, and busy when this
// node or this client has as many claims out as it may.
func (s *Server) claimIn(ctx context.Context, hs handshakeInfo) (conn net.Conn, peer string, busy bool) {
	s.mu.Lock()
	if s.claims >= farmClaimsInFlight || s.claimsFrom[hs.remote] >= farmClaimsPerAddr {
		s.mu.Unlock()
		return nil, "", true
	}
	s.claims++
	s.claimsFrom[hs.remote]++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.claims--
		if s.claimsFrom[hs.remote]--; s.claimsFrom[hs.remote] <= 0 {
			delete(s.claimsFrom, hs.remote)
		}
		s.mu.Unlock()
	}()
	c := farmClaim{connID: hs.connID, method: hs.method, remote: hs.remote.String(), at: time.Now().Unix()}
	if hs.user != nil {
		c.user = hs.user.Name
	}
	ctx, cancel := context.WithDeadline(ctx, hs.deadline())
	defer cancel()
	type answer struct {
		conn net.Conn
		peer string
	}
	peers := s.farmPeers(ctx)
	answers := make(chan answer, len(peers))
	for _, peer := range peers {
		go func() {
			conn, err := s.askPeer(ctx, peer, c)
			switch {
			case err == nil, errors.Is(err, errNotHeld), ctx.Err() != nil:
			case errors.Is(err, errPairing):
				s.log.Warn("farm peer holds the OUT half but refused to pair this IN half with it", "peer", peer, "remote", hs.remote.String())
			default:
				s.peerTrouble.Log(s.log, "farm peer could not be asked for a legacy OUT half", hs.remote, peer+": "+err.Error())
			}
			answers <- answer{conn, peer}
		}()
	}
	var won answer
	for range peers {
		a := <-answers
		switch {
		case a.conn == nil:
		case won.conn == nil:
			won = a
			cancel() // the others need not finish
		default:
			// Two peers each held an OUT half under this id (a client
			// that reused one): the second tunnel is lost.
			s.log.Warn("two farm peers granted an OUT half with one connection id; closing the second", "peer", a.peer, "first", won.peer)
			_ = a.conn.Close()
		}
	}
	return won.conn, won.peer, false
}

// farmPeers are the addresses to ask: each of gateway.farm_peers, and
// for a name, every address it resolves to (a Kubernetes headless
// Service names every gateway pod so).
func (s *Server) farmPeers(ctx context.Context) []string {
	seen := map[string]bool{}
	var out []string
	add := func(a string) {
		if !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	for _, p := range s.cfg.FarmPeers {
		host, port, err := net.SplitHostPort(p)
		if err != nil {
			continue // refused by the configuration's validation
		}
		if _, err := netip.ParseAddr(host); err == nil {
			add(p)
			continue
		}
		addrs, err := net.DefaultResolver.LookupHost(ctx, host)
		if err != nil {
			s.peerTrouble.Log(s.log, "farm peer name does not resolve", netip.Addr{}, p+": "+err.Error())
			continue
		}
		for _, a := range addrs {
			add(net.JoinHostPort(a, port))
		}
	}
	return out
}

// errNotHeld is a peer's answer that it holds no such OUT half; errPairing
// that it holds one the IN half may not join.
var (
	errNotHeld = errors.New("gateway: the peer holds no such OUT half")
	errPairing = errors.New("gateway: the peer refused to pair the halves")
)

// askPeer sends the claim to one peer and returns the granted connection.
func (s *Server) askPeer(ctx context.Context, peer string, c farmClaim) (net.Conn, error) {
	d := &net.Dialer{Timeout: s.cfg.DialTimeout.D()}
	raw, err := d.DialContext(ctx, "tcp", peer)
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { _ = raw.Close() })
	tc := tls.Client(raw, s.farmTLS)
	if err := tc.HandshakeContext(ctx); err != nil {
		stop()
		_ = raw.Close()
		return nil, fmt.Errorf("TLS: %w", err)
	}
	conn, err := s.claimOn(tc, peer, c)
	// The deadline may have closed the connection meanwhile: then it is
	// not the tunnel's.
	if !stop() {
		if conn != nil {
			_ = conn.Close()
		}
		return nil, fmt.Errorf("out of time: %w", ctx.Err())
	}
	if err != nil {
		_ = raw.Close()
	}
	return conn, err
}

// claimOn sends the claim on a peer's TLS connection and reads the grant.
func (s *Server) claimOn(tc *tls.Conn, peer string, c farmClaim) (net.Conn, error) {
	st := tc.ConnectionState()
	if len(st.PeerCertificates) == 0 || !bytes.Equal(st.PeerCertificates[0].Raw, s.farmCert) {
		return nil, errors.New("the peer serves another certificate than this node; every node of a farm serves the farm's certificate")
	}
	ekm, err := farmEKM(st)
	if err != nil {
		return nil, err
	}
	req := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: %s\r\nContent-Length: 0\r\n"+
		"%s: %s\r\n%s: %s\r\n%s: %s\r\n%s: %s\r\n%s: %d\r\n%s: %s\r\n\r\n",
		farmPath, peer, farmUpgrade, hdrConnID, c.connID, hdrMethod, c.method, hdrUser, c.user, hdrRemote, c.remote,
		hdrTime, c.at, hdrMAC, c.mac(s.deps.FarmKey, ekm, "claim"))
	_ = tc.SetDeadline(time.Now().Add(s.cfg.WriteTimeout.D()))
	if _, err := io.WriteString(tc, req); err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	br := bufio.NewReaderSize(tc, 1024)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return nil, fmt.Errorf("answer: %w", err)
	}
	switch resp.StatusCode {
	case http.StatusSwitchingProtocols:
	case http.StatusNotFound:
		return nil, errNotHeld
	case http.StatusForbidden:
		return nil, errPairing
	default:
		return nil, fmt.Errorf("answered HTTP %d", resp.StatusCode)
	}
	if !hmac.Equal([]byte(resp.Header.Get(hdrMAC)), []byte(c.mac(s.deps.FarmKey, ekm, "grant"))) {
		return nil, errors.New("grant not signed with the farm key: not a peer of this farm")
	}
	if br.Buffered() > 0 {
		return nil, errors.New("bytes after the grant")
	}
	_ = tc.SetDeadline(time.Time{})
	return tc, nil
}

// forwardIn carries a legacy IN half, whose OUT half a peer holds, to
// that peer: the client's de-chunked bytes go to peer; when either side
// ends, both connections close.
func (s *Server) forwardIn(in net.Conn, body io.Reader, peer net.Conn, hs handshakeInfo, peerAddr string) {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		_ = in.Close()
		_ = peer.Close()
		hs.conns[0].finish()
		return
	}
	s.forwarded[in] = peer
	s.wg.Add(1)
	s.mu.Unlock()
	s.metrics.farmIn.WithLabelValues("forwarded").Inc()
	s.log.Info("legacy IN half forwarded to the farm peer holding its OUT half", "peer", peerAddr, "remote", hs.remote.String())
	go func() {
		// The peer sends one byte when the tunnel's channel opens: the
		// client's connection leaves its handshake budget then, as on one
		// node. Its end of the connection closing is the tunnel's end.
		var b [1]byte
		if _, err := io.ReadFull(peer, b[:]); err == nil && hs.conns[0].authorize() {
			_, _ = io.Copy(io.Discard, peer)
		}
		_ = peer.Close()
		_ = in.Close()
	}()
	go func() {
		defer s.wg.Done()
		w := &deadlineWriter{c: peer, d: s.cfg.WriteTimeout.D()}
		_, _ = io.Copy(w, body)
		_ = peer.Close()
		_ = in.Close()
		hs.conns[0].finish()
		s.mu.Lock()
		delete(s.forwarded, in)
		s.mu.Unlock()
	}()
}

// deadlineWriter bounds each write: a peer that takes nothing ends it.
type deadlineWriter struct {
	c net.Conn
	d time.Duration
}

func (w *deadlineWriter) Write(p []byte) (int, error) {
	_ = w.c.SetWriteDeadline(time.Now().Add(w.d))
	return w.c.Write(p)
}

// serveFarmIn answers a peer's claim: if the claim is signed with the
// farm key and this node holds the OUT half under the pairing rules, the
// connection becomes the tunnel's IN half.
func (s *Server) serveFarmIn(w http.ResponseWriter, r *http.Request, cs *connState) {
	if r.TLS == nil || !strings.EqualFold(r.Header.Get("Upgrade"), farmUpgrade) {
		plain(w, http.StatusBadRequest, "")
		return
	}
	ekm, err := farmEKM(*r.TLS)
	at, terr := strconv.ParseInt(r.Header.Get(hdrTime), 10, 64)
	c := farmClaim{connID: r.Header.Get(hdrConnID), method: r.Header.Get(hdrMethod), user: r.Header.Get(hdrUser),
		remote: r.Header.Get(hdrRemote), at: at}
	remote, rerr := netip.ParseAddr(c.remote)
	if err != nil || terr != nil || rerr != nil ||
		!hmac.Equal([]byte(r.Header.Get(hdrMAC)), []byte(c.mac(s.deps.FarmKey, ekm, "claim"))) {
		s.metrics.farmIn.WithLabelValues("bad_claim").Inc()
		s.refused.Log(s.log, "farm claim refused: not signed with the farm key", cs.remote, "bad MAC")
		plain(w, http.StatusUnauthorized, "")
		return
	}
	if d := time.Since(time.Unix(at, 0)); d > farmSkew || d < -farmSkew {
		s.metrics.farmIn.WithLabelValues("bad_claim").Inc()
		s.log.Warn("farm claim refused: its time is too far from this node's (check the clocks)", "peer", cs.remote, "skew", d.Round(time.Second).String())
		plain(w, http.StatusUnauthorized, "")
		return
	}
	// A peer's address carries many clients' halves: its link leaves the
	// per-address cap of unauthenticated connections, and keeps the
	// handshake budget.
	cs.exempt()
	s.mu.Lock()
	p, ok := s.pending[c.connID]
	why := ""
	if ok {
		why = pairRefusal(p, c.method, c.user, remote)
		if why == "" {
			delete(s.pending, c.connID)
			p.timer.Stop()
		}
	}
	s.mu.Unlock()
	if !ok {
		plain(w, http.StatusNotFound, "")
		return
	}
	if why != "" {
		s.metrics.farmIn.WithLabelValues("refused").Inc()
		s.log.Warn("RDG_IN_DATA from a farm peer refused", "reason", why, "peer", cs.remote, "remote", remote.String())
		plain(w, http.StatusForbidden, "")
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		p.abandon()
		return
	}
	_ = conn.SetDeadline(time.Now().Add(s.cfg.WriteTimeout.D()))
	grant := fmt.Sprintf("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n%s: %s\r\n\r\n",
		farmUpgrade, hdrMAC, c.mac(s.deps.FarmKey, ekm, "grant"))
	if _, err := io.WriteString(conn, grant); err != nil {
		_ = conn.Close()
		p.abandon()
		return
	}
	_ = conn.SetDeadline(time.Time{})
	s.metrics.farmIn.WithLabelValues("joined").Inc()
	// As on one node, the tunnel is the IN half's: its client address.
	hs := p.hs
	hs.remote = remote
	hs.conns = []*connState{cs, p.hs.conns[0]}
	hs.onOpen = func() {
		_ = conn.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout.D()))
		_, _ = conn.Write([]byte{1})
		_ = conn.SetWriteDeadline(time.Time{})
	}
	lt := &legacyTransport{in: conn, inRaw: cs.raw, out: p.conn, outRaw: p.hs.conns[0].raw,
		g: newWriteGate(p.conn, s.cfg.WriteTimeout.D()), pr: packetReader{r: brw.Reader}}
	s.runTunnel(lt, hs, "legacy")
}

// bareFromBalancer reports whether c, the connection beneath TLS, came
// from a trusted balancer's address without a PROXY header.
func bareFromBalancer(c net.Conn) bool {
	if lc, ok := c.(*loopConn); ok {
		c = lc.Conn
	}
	return proxylisten.IsBare(c)
}
