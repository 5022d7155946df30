// Package wg is the site gateway's encrypted tunnels: per tenant, one
// WireGuard interface whose peers are the tenant's offices.
//
// The datapath is wireguard-go's userspace device (the library Tailscale
// builds on) over its TUN layer, since the kernels deskway targets may
// lack the WireGuard module. The TUN lives in the tenant's network
// namespace, the UDP socket in the namespace the process runs in (the
// underlay), so each tenant's traffic leaves the tunnel only into its own
// namespace, however the tenants' prefixes overlap.
package wg

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
)

// Options are what a Device needs from the gateway around it.
type Options struct {
	// Tenant names the tenant in logs and metrics.
	Tenant string
	// Namespace is the path of the tenant's network namespace
	// (/run/netns/NAME); the gateway creates it and sets forwarding.
	Namespace string
	// Logger receives the device's log; nil discards it.
	Logger *slog.Logger
	// Registerer receives the per-site metrics; nil keeps none.
	Registerer prometheus.Registerer
}

// Device is one tenant's WireGuard interface. New checks, Start creates
// the interface and opens the port, Reload changes the sites without
// dropping the others' sessions, Close removes it all.
type Device struct {
	opts Options
	log  *slog.Logger

	mu        sync.Mutex // guards everything below; serialises Start, Reload, Close and scrapes
	cfg       Config
	key       PrivateKey
	dev       *device.Device
	link      *link
	metrics   *collector
	stopWatch func() bool
	// learnt are the prefixes a route source learnt behind each site.
	learnt  map[string][]netip.Prefix
	started bool
	closed  bool
}

// New checks cfg and returns a Device that has not touched the system.
// key is the private key the caller read from cfg.PrivateKey.
func New(cfg Config, key PrivateKey, opts Options) (*Device, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("wg: tenant %s: %w", opts.Tenant, err)
	}
	if key.IsZero() {
		return nil, fmt.Errorf("wg: tenant %s: private_key: the key read from %s is empty", opts.Tenant, cfg.PrivateKey)
	}
	if opts.Tenant == "" || opts.Namespace == "" {
		return nil, errors.New("wg: a device needs its tenant's name and namespace")
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Device{
		opts: opts,
		log:  log.With("tenant", opts.Tenant),
		cfg:  cfg.withDefaults(),
		key:  key,
	}, nil
}

// Start creates the TUN in the tenant's namespace, configures the
// device, opens the UDP port in the underlay and routes each site's
// prefixes through the interface. Cancelling ctx closes the device.
func (d *Device) Start(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.started || d.closed {
		return errors.New("wg: a device starts once")
	}
	c := d.cfg
	t, err := createTUN(d.opts.Namespace, c.Interface, c.MTU)
	if err != nil {
		return err
	}
	dev := device.NewDevice(nsTUN{Device: t, mtu: c.MTU}, conn.NewDefaultBind(), d.deviceLogger())
	fail := func(err error) error {
		dev.Close() // closes the TUN too, which removes the interface
		return err
	}
	if err := dev.IpcSet(uapiFull(c, d.key)); err != nil {
		return fail(fmt.Errorf("wg: configure %s: %w", c.Interface, err))
	}
	if err := dev.Up(); err != nil {
		return fail(fmt.Errorf("wg: open UDP port %d: %w", c.ListenPort, err))
	}
	l, err := openLink(d.opts.Namespace, c.Interface)
	if err != nil {
		return fail(err)
	}
	if err := l.up(c.Address); err != nil {
		l.close()
		return fail(err)
	}
	for _, s := range c.Sites {
		for _, p := range s.Prefixes {
			if err := l.route(p); err != nil {
				l.close()
				return fail(err)
			}
		}
	}
	d.dev, d.link, d.started = dev, l, true
	if d.opts.Registerer != nil {
		m := newCollector(d)
		if err := d.opts.Registerer.Register(m); err != nil {
			d.closeLocked()
			return fmt.Errorf("wg: metrics of tenant %s: %w", d.opts.Tenant, err)
		}
		d.metrics = m
	}
	d.stopWatch = context.AfterFunc(ctx, func() { _ = d.Close() })
	pub, _ := d.key.Public()
	d.log.Info("wireguard interface up", "interface", c.Interface, "listen_port", c.ListenPort,
		"public_key", pub.String(), "sites", len(c.Sites), "mtu", c.MTU)
	return nil
}

// Reload moves the running device to cfg: sites added, changed or
// removed, the listen port or the key changed. Sessions of sites that
// stay are kept. The interface's name, MTU and addresses change only
// with a restart.
func (d *Device) Reload(cfg Config, key PrivateKey) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("wg: tenant %s: %w", d.opts.Tenant, err)
	}
	if key.IsZero() {
		return fmt.Errorf("wg: tenant %s: private_key: the key read from %s is empty", d.opts.Tenant, cfg.PrivateKey)
	}
	cfg = cfg.withDefaults()
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.started || d.closed {
		return errors.New("wg: reload of a device that is not running")
	}
	old := d.cfg
	if cfg.Interface != old.Interface || cfg.MTU != old.MTU || !slices.Equal(cfg.Address, old.Address) {
		return fmt.Errorf("wg: tenant %s: interface, mtu and address change only with a restart", d.opts.Tenant)
	}
	// What was learnt behind a site that stays stays; a site removed
	// takes its learnt prefixes with it.
	for name, l := range d.learnt {
		if !slices.ContainsFunc(cfg.Sites, func(s Site) bool { return s.Name == name }) {
			for _, p := range l {
				_ = d.link.unroute(p)
			}
			delete(d.learnt, name)
		}
	}
	if err := d.dev.IpcSet(uapiChange(d.withLearnt(old), d.withLearnt(cfg), d.key, key)); err != nil {
		return fmt.Errorf("wg: reconfigure %s: %w", cfg.Interface, err)
	}
	d.cfg, d.key = cfg, key
	keep := map[string]bool{}
	for _, s := range d.withLearnt(cfg).Sites {
		for _, p := range s.Prefixes {
			keep[p.String()] = true
			if err := d.link.route(p); err != nil {
				return err
			}
		}
	}
	for _, s := range old.Sites {
		for _, p := range s.Prefixes {
			if !keep[p.String()] {
				if err := d.link.unroute(p); err != nil {
					return err
				}
			}
		}
	}
	d.log.Info("wireguard interface reloaded", "interface", cfg.Interface, "listen_port", cfg.ListenPort, "sites", len(cfg.Sites))
	return nil
}

// Close removes the interface (and with it its routes) and closes the
// port. It is safe to call more than once.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	if !d.started {
		return nil
	}
	d.closeLocked()
	d.log.Info("wireguard interface down", "interface", d.cfg.Interface)
	return nil
}

func (d *Device) closeLocked() {
	d.closed = true
	if d.stopWatch != nil {
		d.stopWatch()
	}
	if d.metrics != nil {
		d.opts.Registerer.Unregister(d.metrics)
	}
	d.link.close()
	d.dev.Close()
}

// deviceLogger hands wireguard-go's messages to slog: its verbose lines
// (handshakes, keepalives) at Debug, its errors (an office unreachable,
// a bad packet) at Warn, since they are about peers, not our faults.
// wireguard-go names peers by a shortened public key and never logs keys.
func (d *Device) deviceLogger() *device.Logger {
	return &device.Logger{
		Verbosef: func(format string, args ...any) {
			if d.log.Enabled(context.Background(), slog.LevelDebug) {
				d.log.Debug(fmt.Sprintf(format, args...))
			}
		},
		Errorf: func(format string, args ...any) {
			d.log.Warn(fmt.Sprintf(format, args...))
		},
	}
}
