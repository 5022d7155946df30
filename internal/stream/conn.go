package stream

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/deskway/deskway/internal/pki"
	"github.com/deskway/deskway/internal/proto/nbd"
)

// Limits of the negotiation phase.
const (
	negotiateTimeout = 30 * time.Second
	// maxOptionLen is the longest option data read and answered; longer
	// ones up to maxOptionDrain are skipped with NBD_REP_ERR_TOO_BIG, and
	// beyond that the connection is closed.
	maxOptionLen   = 16 << 10
	maxOptionDrain = 1 << 20
	baseContextID  = 1
)

// connReadBuf buffers request headers; a large WRITE payload is read
// past it, so it need not be big, and a thousand clients hold one each.
const connReadBuf = 16 << 10

// conn is one client connection.
type conn struct {
	s      *Server
	nc     net.Conn
	rw     net.Conn // nc, or the TLS connection over it
	r      *bufio.Reader
	remote string

	noZeroes   bool
	tls        bool
	peer       *pki.Identity // the client certificate's, after TLS
	structured bool
	metaBase   bool // base:allocation selected

	wmu  sync.Mutex
	werr error
}

// export is what a connection serves once negotiation ends.
type export struct {
	vd       *vdisk
	img      *image        // the version read where view has nothing
	view     bootCache     // what reads and writes go to; nil reads img
	boot     *boot         // standard mode: the boot this connection belongs to
	private  *privateImage // private mode: the client's own image
	maint    *storeCache   // a maintenance version's delta, written directly
	readOnly bool
	wrote    atomic.Bool // a write, zeroing or trim reached the view
}

func (e *export) flags() nbd.TransmissionFlags {
	f := nbd.FlagHasFlags | nbd.FlagSendFlush | nbd.FlagSendCache
	if (e.vd.mode != "private" && e.maint == nil) || e.readOnly {
		// Connections of one boot share its cache; a private image has
		// one writer.
		f |= nbd.FlagCanMultiConn
	}
	if e.readOnly {
		return f | nbd.FlagReadOnly
	}
	return f | nbd.FlagSendFUA | nbd.FlagSendTrim | nbd.FlagSendWriteZeroes
}

// end releases what the export holds.
func (e *export) end(s *Server, disc bool) {
	switch {
	case e.boot != nil:
		s.detach(e.boot, disc, e.wrote.Load())
	case e.private != nil:
		e.private.close()
		s.log.Info("private image closed", "vdisk", e.vd.name)
	case e.maint != nil && e.readOnly:
		e.maint.release()
	case e.maint != nil:
		// The version's changes stay; only the writer lock goes.
		e.maint.release()
		s.log.Info("maintenance writer closed", "vdisk", e.vd.name)
	}
}

// serveConn serves one client connection, which holds a negotiation slot
// of src until it has chosen its export.
func (s *Server) serveConn(nc net.Conn, src netip.Prefix) {
	defer nc.Close()
	c := &conn{s: s, nc: nc, rw: nc, r: bufio.NewReaderSize(nc, connReadBuf), remote: nc.RemoteAddr().String()}
	log := s.log.With("client_address", c.remote)
	_ = nc.SetDeadline(time.Now().Add(negotiateTimeout))
	exp, err := c.negotiate()
	s.preauth.Release(src)
	if err != nil && exp != nil {
		exp.end(s, false)
	}
	if err != nil {
		if !errors.Is(err, io.EOF) && !errors.Is(err, errAbort) {
			log.Warn("negotiation failed", "err", err)
			s.metrics.refused.Inc()
		}
		return
	}
	_ = nc.SetDeadline(time.Time{})
	s.metrics.conns.Inc()
	defer s.metrics.conns.Dec()
	var disc bool
	if c.onLoop(exp) {
		disc, err = c.transmitOnLoop(exp)
	} else {
		disc, err = c.transmit(exp)
	}
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		log.Warn("connection ended", "vdisk", exp.vd.name, "err", err)
	}
	exp.end(s, disc)
}

var errAbort = errors.New("client aborted negotiation")

func (c *conn) write(b []byte) error {
	_, err := c.rw.Write(b)
	return err
}

func (c *conn) reply(o nbd.Option, t nbd.ReplyType, data []byte) error {
	return c.write(nbd.AppendOptionReply(nil, o, t, data))
}

func (c *conn) replyErr(o nbd.Option, t nbd.ReplyType, format string, a ...any) error {
	return c.reply(o, t, fmt.Appendf(nil, format, a...))
}

// negotiate runs the fixed newstyle handshake and returns the export the
// client chose.
func (c *conn) negotiate() (*export, error) {
	if err := c.write(nbd.AppendGreeting(nil, nbd.FlagFixedNewstyle|nbd.FlagNoZeroes)); err != nil {
		return nil, err
	}
	var hdr [nbd.OptionHeaderLen]byte
	if _, err := io.ReadFull(c.r, hdr[:nbd.ClientFlagsLen]); err != nil {
		return nil, err
	}
	cf, _ := nbd.ParseClientFlags(hdr[:])
	if cf&^(nbd.FlagCFixedNewstyle|nbd.FlagCNoZeroes) != 0 {
		return nil, fmt.Errorf("unknown client flags %#x", uint32(cf))
	}
	if cf&nbd.FlagCFixedNewstyle == 0 {
		return nil, errors.New("client does not speak fixed newstyle negotiation")
	}
	c.noZeroes = cf&nbd.FlagCNoZeroes != 0
	for {
		if _, err := io.ReadFull(c.r, hdr[:]); err != nil {
			return nil, err
		}
		h, err := nbd.ParseOptionHeader(hdr[:])
		if err != nil {
			return nil, err
		}
		if h.Length > maxOptionLen {
			if h.Length > maxOptionDrain || h.Option == nbd.OptExportName {
				return nil, fmt.Errorf("%s with %d bytes of data", h.Option, h.Length)
			}
			if _, err := io.CopyN(io.Discard, c.r, int64(h.Length)); err != nil {
				return nil, err
			}
			if err := c.replyErr(h.Option, nbd.RepErrTooBig, "option data over %d bytes", maxOptionLen); err != nil {
				return nil, err
			}
			continue
		}
		data := make([]byte, h.Length)
		if _, err := io.ReadFull(c.r, data); err != nil {
			return nil, err
		}
		exp, err := c.option(h.Option, data)
		if exp != nil || err != nil {
			return exp, err
		}
	}
}

// option answers one option; a non-nil export ends negotiation.
func (c *conn) option(o nbd.Option, data []byte) (*export, error) {
	s := c.s
	if (s.cfg.TLS == "require" || s.cfg.Clients == "certificate") && !c.tls && o != nbd.OptStartTLS && o != nbd.OptAbort {
		if o == nbd.OptExportName {
			return nil, errors.New("plain-text NBD_OPT_EXPORT_NAME refused: TLS is required")
		}
		return nil, c.replyErr(o, nbd.RepErrTLSReqd, "this server requires TLS (NBD_OPT_STARTTLS)")
	}
	switch o {
	case nbd.OptAbort:
		_ = c.reply(o, nbd.RepAck, nil)
		return nil, errAbort
	case nbd.OptStartTLS:
		return nil, c.startTLS(data)
	case nbd.OptStructuredReply:
		if len(data) != 0 {
			return nil, c.replyErr(o, nbd.RepErrInvalid, "NBD_OPT_STRUCTURED_REPLY takes no data")
		}
		c.structured = true
		return nil, c.reply(o, nbd.RepAck, nil)
	case nbd.OptList:
		if len(data) != 0 {
			return nil, c.replyErr(o, nbd.RepErrInvalid, "NBD_OPT_LIST takes no data")
		}
		for _, v := range s.vdisks {
			if err := c.reply(o, nbd.RepServer, nbd.AppendServer(nil, v.name, v.desc)); err != nil {
				return nil, err
			}
		}
		return nil, c.reply(o, nbd.RepAck, nil)
	case nbd.OptListMetaContext, nbd.OptSetMetaContext:
		return nil, c.metaContext(o, data)
	case nbd.OptExportName:
		t, err := s.parseExport(string(data))
		if err == nil {
			err = c.admit(t)
		}
		if err != nil {
			// The only answer the protocol allows here is to hang up.
			return nil, fmt.Errorf("NBD_OPT_EXPORT_NAME: %w", err)
		}
		exp, err := c.open(t)
		if err != nil {
			return nil, fmt.Errorf("NBD_OPT_EXPORT_NAME: %w", err)
		}
		return exp, c.write(nbd.AppendExportNameReply(nil, uint64(t.vd.size), exp.flags(), c.noZeroes))
	case nbd.OptInfo, nbd.OptGo:
		return c.infoGo(o, data)
	default:
		return nil, c.replyErr(o, nbd.RepErrUnsup, "%s is not supported", o)
	}
}

func (c *conn) startTLS(data []byte) error {
	o := nbd.OptStartTLS
	switch {
	case len(data) != 0:
		return c.replyErr(o, nbd.RepErrInvalid, "NBD_OPT_STARTTLS takes no data")
	case c.s.cfg.TLS == "off":
		return c.replyErr(o, nbd.RepErrUnsup, "TLS is off on this server (stream.tls)")
	case c.tls:
		return c.replyErr(o, nbd.RepErrInvalid, "TLS is already on")
	case c.r.Buffered() != 0:
		return errors.New("client sent data after NBD_OPT_STARTTLS before the reply")
	}
	if err := c.reply(o, nbd.RepAck, nil); err != nil {
		return err
	}
	tc := tls.Server(c.nc, c.s.tls)
	if err := tc.Handshake(); err != nil {
		return fmt.Errorf("TLS handshake: %w", err)
	}
	c.rw, c.tls = tc, true
	if pc := tc.ConnectionState().PeerCertificates; len(pc) > 0 {
		id := pki.IdentityOf(pc[0])
		c.peer = &id
	}
	c.r = bufio.NewReaderSize(tc, connReadBuf)
	// Option state from before TLS does not carry over (the spec's rule
	// against downgrade by a man in the middle).
	c.structured, c.metaBase = false, false
	return nil
}

func (c *conn) metaContext(o nbd.Option, data []byte) error {
	if !c.structured {
		return c.replyErr(o, nbd.RepErrInvalid, "negotiate NBD_OPT_STRUCTURED_REPLY first")
	}
	var req nbd.MetaContextRequest
	if err := req.Decode(data); err != nil {
		return c.replyErr(o, nbd.RepErrInvalid, "%v", err)
	}
	if _, err := c.s.parseExport(req.Name); err != nil {
		return c.replyErr(o, nbd.RepErrUnknown, "%v", err)
	}
	match := false
	for _, q := range req.Queries {
		if q == nbd.MetaContextBaseAllocation || (o == nbd.OptListMetaContext && q == "base:") {
			match = true
		}
	}
	if o == nbd.OptListMetaContext && len(req.Queries) == 0 {
		match = true
	}
	if o == nbd.OptSetMetaContext {
		c.metaBase = match
	}
	if match {
		if err := c.reply(o, nbd.RepMetaContext, nbd.AppendMetaContext(nil, baseContextID, nbd.MetaContextBaseAllocation)); err != nil {
			return err
		}
	}
	return c.reply(o, nbd.RepAck, nil)
}

func (c *conn) infoGo(o nbd.Option, data []byte) (*export, error) {
	var req nbd.InfoRequest
	if err := req.Decode(data); err != nil {
		return nil, c.replyErr(o, nbd.RepErrInvalid, "%v", err)
	}
	t, err := c.s.parseExport(req.Name)
	if err != nil {
		return nil, c.replyErr(o, nbd.RepErrUnknown, "%v", err)
	}
	if err := c.admit(t); err != nil {
		c.s.log.Warn("export refused to the client certificate", "client_address", c.remote, "export", req.Name, "reason", err)
		return nil, c.replyErr(o, nbd.RepErrPolicy, "%s: %v", req.Name, err)
	}
	vd := t.vd
	var exp *export
	if o == nbd.OptGo {
		// Attach before answering, so a boot that cannot be served here
		// is refused while the client can still be told why.
		if exp, err = c.open(t); err != nil {
			return nil, c.replyErr(o, nbd.RepErrPolicy, "%s: %v", req.Name, err)
		}
	}
	probe := exp
	if probe == nil {
		probe = &export{vd: vd, readOnly: !t.writable}
	}
	infos := [][]byte{
		nbd.AppendInfoExport(nil, uint64(vd.size), probe.flags()),
		nbd.AppendInfoBlockSize(nil, 1, prefBlock, maxPayload),
	}
	for _, t := range req.Infos {
		switch t {
		case nbd.InfoName:
			infos = append(infos, nbd.AppendInfoString(nil, nbd.InfoName, req.Name))
		case nbd.InfoDescription:
			if vd.desc != "" {
				infos = append(infos, nbd.AppendInfoString(nil, nbd.InfoDescription, vd.desc))
			}
		}
	}
	for _, in := range infos {
		if err := c.reply(o, nbd.RepInfo, in); err != nil {
			return exp, err
		}
	}
	if err := c.reply(o, nbd.RepAck, nil); err != nil {
		return exp, err
	}
	return exp, nil
}

// admit says whether the client's certificate lets it open t: a client
// opens its own boots and private image, and the base read-only; only a
// certificate with the maintenance role opens a maintenance version.
func (c *conn) admit(t target) error {
	if c.s.cfg.Clients != "certificate" {
		return nil
	}
	if c.peer == nil {
		return errors.New("a client certificate is required (stream.clients: certificate)")
	}
	if t.stage == StageMaintenance && !c.peer.Has(pki.RoleMaintenance) {
		return fmt.Errorf("the certificate of %s has no %s role, which the maintenance version needs", c.peer.Client, pki.RoleMaintenance)
	}
	if t.client != "" && t.client != c.peer.Client {
		return fmt.Errorf("the certificate names client %s, which may not open the boots or private image of %s", c.peer.Client, t.client)
	}
	return nil
}

func (c *conn) open(t target) (*export, error) {
	vd := t.vd
	if t.writable && vd.mode == "private" && t.stage != StageMaintenance {
		from, _, err := vd.imageFor(StageProduction)
		if err != nil {
			return nil, err
		}
		// Each new client name would cost a full copy of the image: only
		// known clients get one on first use.
		known := c.s.cfg.Clients == "certificate" || slices.Contains(vd.clients, t.client)
		img, err := openPrivate(vd.privatePath(t.client), from, known)
		if errors.Is(err, errNoPrivate) {
			return nil, fmt.Errorf("client %s has no private image of %s: make it with deskway vdisk private create %s --client %s (or list the client in stream.vdisks[].clients)",
				t.client, vd.name, vd.name, t.client)
		}
		if err != nil {
			return nil, err
		}
		c.s.log.Info("private image opened", "vdisk", vd.name, "client", t.client)
		return &export{vd: vd, img: &image{base: vd.f, baseFD: vd.fd, size: vd.size}, view: img, private: img}, nil
	}
	img, v, err := vd.imageFor(t.stage)
	if err != nil {
		return nil, err
	}
	if t.stage == StageMaintenance && !t.writable {
		// A read-only look at the version as it stands, which takes no
		// lock: the maintenance writer and promotion go on meanwhile.
		sc, err := viewStoreCache(vd.deltaDir(v.Version), img, vd.size)
		if err != nil {
			return nil, err
		}
		return &export{vd: vd, img: img, view: sc, maint: sc, readOnly: true}, nil
	}
	if t.stage == StageMaintenance {
		// The maintenance version's delta, over its parent's image.
		sc, err := openStoreCache(vd.deltaDir(v.Version), img, vd.size, nil, nil)
		if errors.Is(err, errCacheBusy) {
			return nil, fmt.Errorf("version %d is open for maintenance by another client (one writer at a time)", v.Version)
		}
		if err != nil {
			return nil, err
		}
		c.s.log.Info("maintenance writer opened", "vdisk", vd.name, "version", v.Version, "client", t.client)
		return &export{vd: vd, img: img, view: sc, maint: sc}, nil
	}
	if !t.writable {
		return &export{vd: vd, img: img, readOnly: true}, nil
	}
	b, err := c.s.attach(vd, img, t.stage, t.client, t.boot)
	if err != nil {
		return nil, err
	}
	if err := c.s.record(b); err != nil {
		c.s.detach(b, false, false)
		return nil, err
	}
	return &export{vd: vd, img: b.img, view: b.cache, boot: b}, nil
}
