// Package policy decides who may open a tunnel (connection authorization
// policies, CAP) and which hosts and ports they may reach through it
// (resource authorization policies, RAP). Deny by default: a request that
// no policy allows is refused, and the refusal says which rule was missing.
package policy

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/proto/tsgu"
)

// Auth methods a CAP can allow.
const (
	MethodNTLM = "ntlm"
	MethodPAA  = "paa"
)

// Identity is an authenticated caller.
type Identity struct {
	User   string
	Groups []string
	Method string
	Source netip.Addr
}

// Grant is what the matching CAP allows for a tunnel.
type Grant struct {
	Policy            string
	RedirFlags        uint32
	IdleTimeout       time.Duration
	SessionTimeout    time.Duration
	MaxTunnelsPerUser int
}

// Denied is a refusal with the reason a person can act on.
type Denied struct {
	Code   tsgu.HRESULT
	Reason string
}

// Error gives the reason, which names the policy that decided.
func (d *Denied) Error() string { return "policy: " + d.Reason }

// Resolver looks host names up; net.DefaultResolver satisfies it.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Engine evaluates CAPs and RAPs from config. It is immutable and safe for
// concurrent use.
type Engine struct {
	caps     []config.CAP
	raps     []rap
	resolver Resolver
	defaults config.Gateway
}

type rap struct {
	config.RAP
	prefixes []netip.Prefix
	names    []string
	cert     *HostCert
}

// New builds an engine from validated gateway config.
func New(g *config.Gateway, r Resolver) (*Engine, error) {
	if r == nil {
		r = net.DefaultResolver
	}
	e := &Engine{caps: g.CAP, resolver: r, defaults: *g}
	for _, p := range g.RAP {
		rp := rap{RAP: p, cert: &HostCert{policy: p.Name}}
		for _, pin := range p.HostCertSHA256 {
			sum, err := config.ParseCertPin(pin)
			if err != nil {
				return nil, fmt.Errorf("policy: resource policy %s: %w", p.Name, err)
			}
			rp.cert.pins = append(rp.cert.pins, sum)
		}
		if p.HostCA != "" {
			pem, err := os.ReadFile(p.HostCA)
			if err != nil {
				return nil, fmt.Errorf("policy: resource policy %s: host_certificate_ca: %w", p.Name, err)
			}
			rp.cert.roots = x509.NewCertPool()
			if !rp.cert.roots.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("policy: resource policy %s: host_certificate_ca %s holds no PEM certificate", p.Name, p.HostCA)
			}
		}
		for _, h := range p.Hosts {
			if pf, err := netip.ParsePrefix(h); err == nil {
				rp.prefixes = append(rp.prefixes, pf.Masked())
			} else if a, err := netip.ParseAddr(h); err == nil {
				rp.prefixes = append(rp.prefixes, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
			} else if strings.Contains(h, "/") {
				return nil, fmt.Errorf("policy: resource policy %s: bad prefix %q", p.Name, h)
			} else {
				rp.names = append(rp.names, strings.ToLower(strings.TrimSuffix(h, ".")))
			}
		}
		e.raps = append(e.raps, rp)
	}
	return e, nil
}

func matches(id Identity, users, groups []string) bool {
	for _, u := range users {
		if strings.EqualFold(u, id.User) || u == "*" {
			return true
		}
	}
	for _, g := range groups {
		for _, have := range id.Groups {
			if strings.EqualFold(g, have) {
				return true
			}
		}
	}
	return false
}

// Connect finds the first CAP that admits id with its auth method.
func (e *Engine) Connect(id Identity) (*Grant, error) {
	methodRefused := ""
	for _, c := range e.caps {
		if !matches(id, c.Users, c.Groups) {
			continue
		}
		if len(c.AuthMethods) > 0 && !slices.Contains(c.AuthMethods, id.Method) {
			methodRefused = c.Name
			continue
		}
		g := &Grant{
			Policy:            c.Name,
			RedirFlags:        redirFlags(c.Redirection),
			IdleTimeout:       e.defaults.IdleTimeout.D(),
			SessionTimeout:    e.defaults.SessionTimeout.D(),
			MaxTunnelsPerUser: c.MaxTunnelsPerUser,
		}
		if c.IdleTimeout > 0 {
			g.IdleTimeout = c.IdleTimeout.D()
		}
		if c.SessionTimeout > 0 {
			g.SessionTimeout = c.SessionTimeout.D()
		}
		return g, nil
	}
	if methodRefused != "" {
		return nil, &Denied{tsgu.EProxyNAPAccessDenied, fmt.Sprintf("connection policy %s does not allow %s logins for %s", methodRefused, id.Method, id.User)}
	}
	return nil, &Denied{tsgu.EProxyNAPAccessDenied, fmt.Sprintf("no connection policy admits user %s (groups %v)", id.User, id.Groups)}
}

// redirFlags maps the policy's allowed device classes to the flags sent in
// the tunnel auth response. Empty or "all" enables everything.
func redirFlags(allowed []string) uint32 {
	if len(allowed) == 0 || slices.Contains(allowed, "all") {
		return tsgu.RedirEnableAll
	}
	if slices.Contains(allowed, "none") {
		return tsgu.RedirDisableAll
	}
	flags := tsgu.RedirDisableDrive | tsgu.RedirDisablePrinter | tsgu.RedirDisablePort | tsgu.RedirDisableClipboard | tsgu.RedirDisablePnP
	for _, a := range allowed {
		switch a {
		case "drives":
			flags &^= tsgu.RedirDisableDrive
		case "printers":
			flags &^= tsgu.RedirDisablePrinter
		case "ports":
			flags &^= tsgu.RedirDisablePort
		case "clipboard":
			flags &^= tsgu.RedirDisableClipboard
		case "pnp":
			flags &^= tsgu.RedirDisablePnP
		}
	}
	return flags
}

// Target is a resolved, authorized destination: dial Addr, nothing else, so
// a later DNS answer cannot move the tunnel past the policy.
type Target struct {
	Name   string
	Addr   netip.AddrPort
	Policy string
	// Cert checks the host's certificate where the gateway itself does
	// TLS with the host.
	Cert *HostCert
}

// HostCert is how a resource policy trusts its hosts' certificates:
// pinned fingerprints, a CA bundle, or the system's roots.
type HostCert struct {
	policy string
	pins   [][32]byte
	roots  *x509.CertPool // nil: the system's
}

// Verify checks chain (leaf first), presented by the host the client
// named name. Its errors say what to put in the policy to trust the host.
func (h *HostCert) Verify(name string, chain []*x509.Certificate) error {
	if len(chain) == 0 {
		return errors.New("the host presented no certificate")
	}
	sum := sha256.Sum256(chain[0].Raw)
	if len(h.pins) > 0 {
		for _, p := range h.pins {
			if subtle.ConstantTimeCompare(p[:], sum[:]) == 1 {
				return nil
			}
		}
		return fmt.Errorf("the host's certificate (sha256 %x) is not among those resource policy %s pins in host_certificate_sha256", sum, h.policy)
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{DNSName: name, Roots: h.roots, Intermediates: inter}); err != nil {
		return fmt.Errorf("the host's certificate is not trusted (%v): pin it in resource policy %s with host_certificate_sha256: [%x], or give host_certificate_ca", err, h.policy, sum)
	}
	return nil
}

// Resource resolves name once and checks the RAPs against the name and the
// address it resolved to. It returns the address to dial.
func (e *Engine) Resource(ctx context.Context, id Identity, name string, port uint16) (*Target, error) {
	name = strings.ToLower(strings.TrimSuffix(strings.TrimSpace(name), "."))
	if name == "" {
		return nil, &Denied{tsgu.EProxyRAPAccessDenied, "empty resource name"}
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(strings.Trim(name, "[]")); err == nil {
		addrs = []netip.Addr{a.Unmap()}
	} else {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		found, err := e.resolver.LookupNetIP(rctx, "ip", name)
		cancel()
		if err != nil || len(found) == 0 {
			return nil, &Denied{tsgu.EProxyTSConnectFailed, fmt.Sprintf("cannot resolve %s: %v", name, err)}
		}
		for _, a := range found {
			addrs = append(addrs, a.Unmap())
		}
	}
	for _, r := range e.raps {
		if !matches(id, r.Users, r.Groups) {
			continue
		}
		if len(r.Ports) > 0 && !slices.Contains(r.Ports, int(port)) {
			continue
		}
		if slices.Contains(r.names, name) {
			return &Target{Name: name, Addr: netip.AddrPortFrom(addrs[0], port), Policy: r.Name, Cert: r.cert}, nil
		}
		for _, a := range addrs {
			for _, p := range r.prefixes {
				if p.Contains(a) {
					return &Target{Name: name, Addr: netip.AddrPortFrom(a, port), Policy: r.Name, Cert: r.cert}, nil
				}
			}
		}
	}
	return nil, &Denied{tsgu.EProxyRAPAccessDenied, fmt.Sprintf("no resource policy lets %s reach %s:%d (resolved to %v)", id.User, name, port, addrs)}
}
