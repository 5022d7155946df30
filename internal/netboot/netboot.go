// Package netboot is the stream role's boot services for machines with
// no disk: a DHCP server (proxyDHCP beside the network's own, or a full
// one on a boot network of its own) that points PXE and UEFI HTTP Boot
// clients at the iPXE build of their architecture, a TFTP server for
// those first stages, and an HTTP server for them (HTTP Boot), each
// device's iPXE script and its vDisk's kernel and initramfs. Devices are
// recognised by MAC address and boot the vDisk an administrator assigned
// them; the kernel command line names the stream export of their root
// disk, with a fresh boot id each power-on.
package netboot

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"
	"github.com/pin/tftp/v3"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/netutil"

	"github.com/deskway/deskway/internal/config"
)

// Deps are what the boot services need from the stream role.
type Deps struct {
	Logger   *slog.Logger
	Registry prometheus.Registerer
	// StateDir keeps the device records and the DHCP leases.
	StateDir string
	// StreamPort is stream.listen's port, for the default server list.
	StreamPort string
	// Live lists the stream server's live boots, for what each device
	// runs now.
	Live func() []LiveBoot
	Now  func() time.Time
}

// Service is the boot services of one stream server.
type Service struct {
	cfg     *config.Netboot
	vdisks  map[string]config.VDisk
	names   []string
	log     *slog.Logger
	now     func() time.Time
	devices *Devices
	boot    boot
	full    *full // nil in proxy mode
	servers []string
	balance balancer
	live    func() []LiveBoot
	m       *metrics
	// tftpSlots bounds TFTP transfers in progress.
	tftpSlots chan struct{}
}

// New builds the boot services from the stream config.
func New(st *config.Stream, d Deps) (*Service, error) {
	cfg := st.Netboot
	if d.Now == nil {
		d.Now = time.Now
	}
	devs, err := OpenDevices(filepath.Join(d.StateDir, "netboot-devices.json"))
	if err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, vdisks: map[string]config.VDisk{}, log: d.Logger, now: d.Now, devices: devs,
		boot: boot{server: net.ParseIP(cfg.Address).To4(), httpPort: cfg.HTTPPort, secureBoot: cfg.SecureBoot}, servers: cfg.Servers, live: d.Live, m: newMetrics(d.Registry),
		tftpSlots: make(chan struct{}, maxTFTP)}
	for _, v := range st.VDisks {
		s.vdisks[v.Name] = v
		s.names = append(s.names, v.Name)
	}
	if len(s.servers) == 0 {
		s.servers = []string{net.JoinHostPort(cfg.Address, d.StreamPort)}
	}
	s.balance.handedOut = map[string][]time.Time{}
	if st.SharedCache {
		s.balance.dir = loadDir(st.Store)
	}
	if p := cfg.Pool; p != nil {
		start, end := netip.MustParseAddr(p.Start), netip.MustParseAddr(p.End)
		pool, err := OpenPool(filepath.Join(d.StateDir, "netboot-leases.json"), start, end, p.Lease.D())
		if err != nil {
			return nil, err
		}
		s.full = &full{boot: s.boot, pool: pool, netmask: net.IPMask(net.ParseIP(p.Netmask).To4())}
		if p.Router != "" {
			s.full.router = net.ParseIP(p.Router).To4()
		}
	}
	return s, nil
}

// Devices is the device records, for the admin API.
func (s *Service) Devices() *Devices { return s.devices }

// Run serves DHCP, TFTP and HTTP on the boot network until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 5)
	start := func(name string, run func() error, stop func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(); err != nil && ctx.Err() == nil {
				errc <- fmt.Errorf("netboot %s: %w", name, err)
			}
		}()
		go func() { <-ctx.Done(); stop() }()
	}
	dhcp, err := server4.NewIPv4UDPConn(s.cfg.Interface, &net.UDPAddr{Port: dhcpv4.ServerPort})
	if err != nil {
		return fmt.Errorf("netboot: DHCP on %s: %w", s.cfg.Interface, err)
	}
	start("DHCP", func() error { return s.serveDHCP(dhcp, false) }, func() { dhcp.Close() })
	if s.full == nil {
		// PXE clients ask a proxyDHCP server for their boot file again on
		// port 4011, unicast, once they have an address.
		pxe, err := server4.NewIPv4UDPConn(s.cfg.Interface, &net.UDPAddr{IP: s.boot.server, Port: 4011})
		if err != nil {
			return fmt.Errorf("netboot: proxyDHCP port 4011: %w", err)
		}
		start("proxyDHCP", func() error { return s.serveDHCP(pxe, true) }, func() { pxe.Close() })
	}
	if *s.cfg.RouterAdvertisements {
		start("router advertisements", func() error { return s.serveRouterSolicitations(ctx, s.cfg.Interface) }, func() {})
	}
	tconn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: s.boot.server, Port: 69})
	if err != nil {
		return fmt.Errorf("netboot: TFTP: %w", err)
	}
	ts := tftp.NewServer(s.tftpRead, nil)
	ts.SetTimeout(5 * time.Second)
	ts.SetRetries(2)
	start("TFTP", func() error { return ts.Serve(tconn) }, func() { ts.Shutdown() })
	hln, err := net.Listen("tcp4", net.JoinHostPort(s.cfg.Address, strconv.Itoa(s.cfg.HTTPPort)))
	if err != nil {
		return fmt.Errorf("netboot: HTTP: %w", err)
	}
	// A kernel and an initramfs take seconds on a boot network; a client
	// that reads slower than that in ten minutes is cut off.
	hs := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 10 * time.Minute,
		IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10, ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)}
	hln = netutil.LimitListener(hln, maxHTTPConns)
	start("HTTP", func() error {
		if err := hs.Serve(hln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}, func() { hs.Close() })
	s.log.Info("network boot services listening", "interface", s.cfg.Interface, "address", s.cfg.Address, "dhcp", s.cfg.DHCP,
		"http", hln.Addr().String(), "devices", len(s.devices.List()))
	select {
	case err = <-errc:
	case <-ctx.Done():
	}
	cancel()
	wg.Wait()
	return err
}

// serveDHCP answers the DHCP requests on conn, one at a time: an answer
// is a few microseconds of work, and anyone on the boot network can send
// requests, so no goroutine or buffer is held per packet.
func (s *Service) serveDHCP(conn *net.UDPConn, port4011 bool) error {
	buf := make([]byte, 1500)
	var lastWarn time.Time
	for {
		n, peer, err := conn.ReadFromUDP(buf)
		if err != nil {
			return err
		}
		m, err := dhcpv4.FromBytes(buf[:n])
		if err != nil || m.OpCode != dhcpv4.OpcodeBootRequest {
			s.m.dhcp.WithLabelValues("malformed").Inc()
			continue
		}
		var r *dhcpv4.DHCPv4
		switch {
		case s.full != nil:
			r, err = s.full.reply(m, s.now())
			if err != nil && time.Since(lastWarn) > time.Minute {
				// Anyone can send requests: one line a minute at most.
				lastWarn = time.Now()
				s.log.Warn("DHCP request not answered", "mac", m.ClientHWAddr.String(), "error", err)
			}
		case port4011 || m.MessageType() == dhcpv4.MessageTypeDiscover:
			r = s.boot.proxyReply(m)
		}
		if r == nil {
			s.m.dhcp.WithLabelValues("ignored").Inc()
			continue
		}
		to := &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpv4.ClientPort}
		if port4011 || !m.ClientIPAddr.IsUnspecified() && m.ClientIPAddr != nil {
			to = peer // a client with an address is answered where it asked from
		}
		if _, err := conn.WriteToUDP(r.ToBytes(), to); err != nil {
			s.log.Warn("DHCP answer not sent", "mac", m.ClientHWAddr.String(), "error", err)
			continue
		}
		s.m.dhcp.WithLabelValues(strings.ToLower(r.MessageType().String())).Inc()
		s.log.Debug("DHCP", "mac", m.ClientHWAddr.String(), "asked", m.MessageType().String(), "answered", r.MessageType().String(),
			"address", r.YourIPAddr.String(), "boot_file", r.BootFileName)
	}
}

// Limits on what the boot network's unauthenticated clients hold at once:
// TFTP transfers (each a goroutine, a socket and an open file for up to
// 15 s) and HTTP connections.
const (
	maxTFTP      = 32
	maxHTTPConns = 256
)

// tftpRead serves iPXE's first stages (with secure_boot, the signed
// chain's files too) and nothing else, to at most maxTFTP clients at a
// time; the others are refused at once, and their firmware asks again.
func (s *Service) tftpRead(name string, rf io.ReaderFrom) error {
	name = strings.TrimPrefix(name, "/")
	var remote string
	if t, ok := rf.(tftp.OutgoingTransfer); ok {
		a := t.RemoteAddr()
		remote = a.String()
	}
	var open func() (io.ReadCloser, int64, error)
	switch {
	case slices.Contains(slices.Collect(maps.Values(pxeStages)), name):
		open = openFile(filepath.Join(s.cfg.IPXEDir, name))
	case s.cfg.SecureBoot:
		open = s.secureBootFile(name, remote)
	}
	if open == nil {
		s.m.tftp.WithLabelValues("refused").Inc()
		s.log.Debug("TFTP: refused", "file", name, "remote", remote)
		return fmt.Errorf("no file %q here: deskway serves undionly.kpxe, ipxe.efi and ipxe-arm64.efi", name)
	}
	select {
	case s.tftpSlots <- struct{}{}:
		defer func() { <-s.tftpSlots }()
	default:
		s.m.tftp.WithLabelValues("busy").Inc()
		return fmt.Errorf("busy: %d transfers already; try again", maxTFTP)
	}
	s.m.tftp.WithLabelValues("served").Inc()
	f, size, err := open()
	if err != nil {
		s.log.Warn("TFTP: a boot file is missing (install Debian's ipxe package, or set stream.netboot.ipxe_dir; with secure_boot, shim-signed and grub-efi-amd64-signed)", "file", name, "error", err)
		return err
	}
	defer f.Close()
	s.log.Debug("TFTP", "file", name, "remote", remote, "bytes", size)
	if t, ok := rf.(tftp.OutgoingTransfer); ok {
		t.SetSize(size)
	}
	_, err = rf.ReadFrom(f)
	return err
}

// newBootID is a fresh id for one power-on: the name of its write cache.
func newBootID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

type metrics struct {
	dhcp    *prometheus.CounterVec
	scripts *prometheus.CounterVec
	tftp    *prometheus.CounterVec
	ra      *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		dhcp: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "deskway_netboot_dhcp_total",
			Help: "DHCP requests on the boot network by answer: offer, ack, nak, ignored, malformed."}, []string{"answer"}),
		scripts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "deskway_netboot_scripts_total",
			Help: "iPXE boot scripts served by outcome: boot, menu, unknown, added, disabled, not_in_menu, unassigned, no_kernel."}, []string{"result"}),
		tftp: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "deskway_netboot_tftp_total",
			Help: "TFTP read requests by outcome: served, refused (a file deskway does not serve), busy (too many transfers at once)."}, []string{"result"}),
		ra: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "deskway_netboot_router_advertisements_total",
			Help: "IPv6 router solicitations heard on the boot network (solicited) and the advertisements answering them (advertised, failed)."}, []string{"event"}),
	}
	if reg != nil {
		reg.MustRegister(m.dhcp, m.scripts, m.tftp, m.ra)
	}
	return m
}
