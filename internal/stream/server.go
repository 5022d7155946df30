// Package stream is the vDisk streaming role: an NBD server from which
// diskless machines boot a shared golden image. In standard mode every
// client boot sees the base image through its own write cache, which is
// discarded when the boot ends; the base file is only ever read.
//
// A client names itself in the export name: "VDISK/CLIENT/BOOT" opens a
// writable view for that client's boot (the same name after a reconnect
// gets the same writes back), "VDISK/CLIENT" is a boot with an empty boot
// id, and a bare "VDISK" is a read-only view of the base. A boot ends when
// a connection sends NBD_CMD_DISC (once all its connections are gone), or
// when its last connection has been gone for the reconnect window.
package stream

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"

	"github.com/deskway/deskway/internal/admission"
	"github.com/deskway/deskway/internal/config"
)

// Sizes the server announces in NBD_INFO_BLOCK_SIZE; maxPayload is also
// the largest READ or WRITE it serves.
const (
	prefBlock  = 4096
	maxPayload = 32 << 20
)

// Deps are what the server needs from the process.
type Deps struct {
	Logger   *slog.Logger
	Registry prometheus.Registerer
	// TLS is the certificate served after NBD_OPT_STARTTLS; needed unless
	// stream.tls is off.
	TLS *tls.Config
	// ClientCAs verify client certificates; needed when stream.clients is
	// certificate.
	ClientCAs *x509.CertPool
}

// Server serves the configured vDisks over NBD.
type Server struct {
	cfg     *config.Stream
	log     *slog.Logger
	tls     *tls.Config
	metrics *metrics
	vdisks  []*vdisk
	byName  map[string]*vdisk

	trace    *tracer
	bufs     bufPool
	buffers  *semaphore.Weighted // bytes of requests in progress, all connections
	loops    *loops              // while Serve runs
	reserver *reserver           // while Serve runs
	quota    *cacheQuota         // write-cache bytes, all boots and per client
	preauth  *admission.Limiter  // connections still negotiating
	refused  admission.Refusals

	// bootLog records live boots whose caches die with the process (RAM
	// and unlinked spill files); nil with shared caches, whose files on
	// the store are their own record.
	bootLog *bootLog

	// beforeCacheLock, when not nil, runs as a boot's shared cache is
	// about to be locked (see openStoreCache); tests set it.
	beforeCacheLock func(dir string)

	// assigned names the devices assigned to a stage (SetAssigned).
	assigned AssignedFunc

	mu    sync.Mutex
	boots map[string]*boot
	conns map[net.Conn]struct{}
	// onLoops are the connections served on event loops, whose sockets
	// only their loops hold (see transmitOnLoop); stopping is set once
	// Serve is ending them, after which none is added.
	onLoops  map[*loopConn]struct{}
	stopping bool
	wg       sync.WaitGroup
}

// vdisk is one catalog entry with its base image open read-only.
type vdisk struct {
	name, desc, mode string
	path             string
	f                *os.File
	fd               int // f's descriptor, for sendfile
	size             int64
	store            string   // holds versions/NAME/ and private/NAME/
	clients          []string // may have a private image made on first use

	mu           sync.Mutex // guards what follows
	manifest     manifest
	manifestTime time.Time
	images       map[string]*image // what production and test clients boot
	built        map[int]*image    // finished versions, opened once
	merging      bool
}

// bootCache is a client boot's private view of its vDisk.
type bootCache interface {
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	WriteZeroes(off, n int64) error
	// Sync makes acknowledged writes durable (FLUSH, FUA).
	Sync() error
	// Trim may forget [off, off+n): NBD_CMD_TRIM lets those bytes read
	// back as anything.
	Trim(off, n int64)
	bytes() (ram, spilled int64)
	// baseOnly reports whether [off, off+n) holds nothing but base
	// bytes, which can then go to the client straight from the base file.
	baseOnly(off, n int64) bool
	// source says whether block blk was written, as data or as zeroes, or
	// reads what lies below the cache.
	source(blk int64) blockSource
	// unheld counts the blocks a write (or zeroing) of n bytes at off
	// would add to the cache.
	unheld(off, n int64, zeroes bool) int64
	// close discards the cache.
	close()
}

// blockSource is where a block of a boot's view comes from.
type blockSource uint8

const (
	fromBelow     blockSource = iota // never written: the version's image
	fromCacheData                    // written
	fromCacheZero                    // written as zeroes
)

// boot is one client boot's write cache and the connections using it.
type boot struct {
	key          string
	vd           *vdisk
	img          *image // the version this boot started on, kept to its end
	client, id   string
	cache        bootCache // nil while a shared cache is released
	acct         *cacheAccount
	dir          string // the shared cache's directory
	conns        int
	ended        bool
	started      time.Time
	discardTimer *time.Timer

	recordOnce sync.Once // the boot log's start record, by its first connection
	recordErr  error
}

// New opens every vDisk's base image read-only.
func New(cfg *config.Stream, d Deps) (*Server, error) {
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.TLS != "off" && d.TLS == nil {
		return nil, errors.New("stream: stream.tls is " + cfg.TLS + " but no certificate was given")
	}
	if cfg.Clients == "certificate" {
		if d.ClientCAs == nil {
			return nil, errors.New("stream: stream.clients is certificate but no client CA was given")
		}
		tc := d.TLS.Clone()
		tc.ClientAuth, tc.ClientCAs = tls.RequireAndVerifyClientCert, d.ClientCAs
		d.TLS = tc
	} else {
		d.Logger.Warn("stream.clients is open: any machine that reaches the NBD port can read and overwrite every client's boots and private images and write maintenance versions; use it only on a network where every machine is trusted",
			"listen", cfg.Listen)
	}
	s := &Server{cfg: cfg, log: d.Logger, tls: d.TLS, byName: map[string]*vdisk{}, buffers: semaphore.NewWeighted(int64(cfg.MaxBufferMB) << 20),
		boots: map[string]*boot{}, conns: map[net.Conn]struct{}{}, onLoops: map[*loopConn]struct{}{},
		quota:   newCacheQuota(int64(cfg.MaxCacheMB)<<20, int64(cfg.MaxCacheMBPerClient)<<20),
		preauth: admission.New(cfg.MaxUnauthenticated, cfg.MaxUnauthenticatedPerAddr)}
	s.metrics = newMetrics(d.Registry, s.cacheRAM, func() float64 { return float64(s.quota.used.Load()) })
	if cfg.Trace != "" {
		t, err := newTracer(cfg.Trace)
		if err != nil {
			return nil, err
		}
		s.trace = t
	}
	for _, v := range cfg.VDisks {
		f, err := os.Open(v.Base)
		if err != nil {
			s.closeFiles()
			return nil, fmt.Errorf("stream: vDisk %s: %w", v.Name, err)
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			s.closeFiles()
			return nil, fmt.Errorf("stream: vDisk %s: %w", v.Name, err)
		}
		vd := &vdisk{name: v.Name, desc: v.Description, mode: v.Mode, path: v.Base, f: f, fd: int(f.Fd()), size: fi.Size(), store: cfg.Store,
			clients: v.Clients}
		if err := vd.loadVersions(); err != nil {
			f.Close()
			s.closeFiles()
			return nil, fmt.Errorf("stream: vDisk %s versions: %w", v.Name, err)
		}
		for _, dir := range []string{vd.privateDir(), vd.versionsDir()} {
			n, size, err := removePartialCopies(dir)
			if n > 0 {
				s.log.Info("removed partial copies a stopped server left", "vdisk", vd.name, "dir", dir, "files", n, "bytes", size)
			}
			if err != nil {
				s.log.Warn("could not remove a partial copy", "vdisk", vd.name, "err", err)
			}
		}
		s.vdisks = append(s.vdisks, vd)
		s.byName[v.Name] = vd
	}
	if !cfg.SharedCache {
		l, err := openBootLog(filepath.Join(cfg.Store, "boots.log"), nil, time.Now())
		if err != nil {
			s.closeFiles()
			return nil, err
		}
		if n := len(l.lost); n > 0 {
			s.log.Warn("boots that were live when the server stopped lost their write caches; their clients are refused until they boot again with a new boot id",
				"lost_boots", n, "boot_log", l.path)
		}
		s.bootLog = l
	}
	return s, nil
}

func (s *Server) closeFiles() {
	for _, v := range s.vdisks {
		v.f.Close()
	}
	if s.bootLog != nil {
		if err := s.bootLog.close(); err != nil {
			s.log.Error("boot log", "err", err)
		}
	}
	if s.trace != nil {
		s.trace.close()
	}
}

// Serve accepts NBD clients on ln until ctx ends, then closes every
// connection, drops every write cache and returns.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	ls, err := startLoops()
	if err != nil {
		ln.Close()
		s.closeFiles()
		return err
	}
	s.loops = ls
	s.reserver = startReserver()
	if s.cfg.SharedCache {
		sctx, stop := context.WithCancel(ctx)
		defer stop()
		go s.sweep(sctx)
	}
	s.log.Info("stream listening", "addr", ln.Addr().String(), "tls", s.cfg.TLS, "vdisks", len(s.vdisks))
	var backoff time.Duration
	for {
		var c net.Conn
		c, err = ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				err = nil
				break
			}
			// Out of descriptors (EMFILE, ENFILE) or a connection aborted
			// before it was accepted: the listener is fine, and giving up
			// would end every live boot. Wait, as net/http does, and go on.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Warn("accept failed; retrying", "err", err, "in", backoff)
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
			}
			continue
		}
		backoff = 0
		if tc, ok := c.(*net.TCPConn); ok {
			deadPeerChecks(tc)
		}
		src, why := s.admit(c)
		if why != "" {
			c.Close()
			continue
		}
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serveConn(c, src)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		}()
	}
	s.mu.Lock()
	s.stopping = true
	for c := range s.conns {
		c.Close()
	}
	for k := range s.onLoops {
		// Ended on its loop, which alone touches its descriptor: from
		// here it might be closed already and its number reused.
		_ = k.l.Post(func() { k.end(net.ErrClosed) })
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.loops.close()
	s.reserver.close()
	s.mu.Lock()
	for _, b := range s.boots {
		if s.cfg.SharedCache {
			// Kept on the store for another server (or this one, restarted).
			if b.discardTimer != nil {
				b.discardTimer.Stop()
			}
			if b.cache != nil {
				b.cache.(*storeCache).release()
			}
			continue
		}
		// Still recorded as live: a client that comes back to this boot
		// after a restart is refused, not handed an empty disk.
		s.dropLocked(b, "server stopped")
	}
	s.mu.Unlock()
	s.closeFiles()
	s.log.Info("stream stopped")
	return err
}

// target is what an export name asks for.
type target struct {
	vd       *vdisk
	stage    string // "", production, test, maintenance or vN
	client   string
	boot     string
	writable bool
}

// parseExport splits an export name, VDISK[@STAGE][/CLIENT[/BOOT]], into
// its parts.
func (s *Server) parseExport(name string) (target, error) {
	if name == "" && len(s.vdisks) > 0 {
		return target{vd: s.vdisks[0]}, nil
	}
	parts := strings.SplitN(name, "/", 3)
	vname, stage, _ := strings.Cut(parts[0], "@")
	t := target{vd: s.byName[vname], stage: stage}
	if t.vd == nil {
		return t, fmt.Errorf("no vDisk named %q", vname)
	}
	if len(parts) == 1 {
		return t, nil
	}
	t.client, t.writable = parts[1], true
	if len(parts) == 3 {
		t.boot = parts[2]
	}
	if !validID(t.client, false) || !validID(t.boot, true) {
		return t, fmt.Errorf("export %q: use VDISK[@STAGE]/CLIENT/BOOT, ids of up to 128 letters, digits, '.', '_', ':' or '-'", name)
	}
	if t.vd.mode == "private" && stage != "" && stage != StageMaintenance {
		return t, fmt.Errorf("export %q: vDisk %s is in private mode: each client boots its own image (a new one starts from the newest production version)", name, vname)
	}
	return t, nil
}

// validID reports whether an id from an export name is safe as a path
// element: 1 to 128 of [A-Za-z0-9._:-], not "." or "..".
func validID(id string, emptyOK bool) bool {
	if id == "" {
		return emptyOK
	}
	if len(id) > 128 || id == "." || id == ".." {
		return false
	}
	for _, r := range id {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == ':' || r == '-'
		if !ok {
			return false
		}
	}
	return true
}

// admit takes a negotiation slot for a new connection, or says which cap
// of connections still negotiating is full (logged at most once a second).
func (s *Server) admit(c net.Conn) (netip.Prefix, string) {
	ap, _ := netip.ParseAddrPort(c.RemoteAddr().String())
	src, why := s.preauth.Admit(ap.Addr().Unmap(), "the stream server")
	if why != "" {
		s.metrics.refused.Inc()
		s.refused.Log(s.log, "connection refused before negotiation", ap.Addr().Unmap(), why)
	}
	return src, why
}
