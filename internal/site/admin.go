package site

import (
	"encoding/json"
	"net/http"
	"time"
)

// TenantStatus is one tenant's tunnels for the admin API.
type TenantStatus struct {
	Name      string            `json:"name"`
	Key       uint32            `json:"key"`
	Namespace string            `json:"namespace"`
	Interface string            `json:"interface"`
	Sites     []SiteStatus      `json:"sites"`
	Drops     map[string]uint64 `json:"drops"`
}

// SiteStatus is one site's tunnel with its counters since start. A GRE
// site is up while its packets keep coming (GRE has no handshake); a
// WireGuard site while its last handshake is under 180 seconds old, and
// WireGuard counts bytes only.
type SiteStatus struct {
	// Kind is gre or wireguard.
	Kind         string     `json:"kind"`
	Name         string     `json:"name"`
	Peer         string     `json:"peer"`
	Prefixes     []string   `json:"prefixes"`
	State        string     `json:"state"`
	LastReceived *time.Time `json:"last_received,omitempty"`
	// LastHandshake is a WireGuard site's.
	LastHandshake *time.Time `json:"last_handshake,omitempty"`
	PacketsIn     uint64     `json:"packets_in"`
	BytesIn       uint64     `json:"bytes_in"`
	PacketsOut    uint64     `json:"packets_out"`
	BytesOut      uint64     `json:"bytes_out"`
	// Keepalives are the GRE keepalives sent back to the site's router.
	Keepalives uint64 `json:"keepalives"`
	// Datapath is a GRE site's: kernel while deskway's tc programs
	// carry it (the counters add theirs), else userspace.
	Datapath string `json:"datapath,omitempty"`
}

// Tunnels is every tenant's tunnels and counters now; the drops that
// name no tenant (malformed GRE, a key of no tenant) are under the
// tenant with no name.
func (s *Server) Tunnels() []TenantStatus {
	now := time.Now()
	var out []TenantStatus
	// A reload changes the tenants' extras under mu.
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kernelCounters()
	for _, t := range s.set.Load().list {
		ts := TenantStatus{Name: t.name, Key: t.key, Namespace: t.nsName, Interface: t.ifName, Drops: t.m.dropped(), Sites: []SiteStatus{}}
		for _, st := range t.c().sites {
			ss := SiteStatus{Kind: "gre", Name: st.name, Peer: st.peer.String(), State: st.state(now),
				PacketsIn: st.pktsIn.Load(), BytesIn: st.bytesIn.Load(), PacketsOut: st.pktsOut.Load(), BytesOut: st.bytesOut.Load(), Keepalives: st.keepalives.Load(),
				Datapath: s.kernelCarries(t, st)}
			for _, p := range st.prefixes {
				ss.Prefixes = append(ss.Prefixes, p.String())
			}
			if last := st.lastIn.Load(); last != 0 {
				at := time.Unix(0, last).UTC()
				ss.LastReceived = &at
			}
			ts.Sites = append(ts.Sites, ss)
		}
		ts.Sites = append(ts.Sites, s.wireGuardSites(t)...)
		out = append(out, ts)
	}
	out = append(out, TenantStatus{Drops: s.m.unknown.dropped(), Sites: []SiteStatus{}})
	return out
}

// AdminHandler serves GET /api/v1/site/tunnels.
func (s *Server) AdminHandler() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/site/tunnels", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		body := map[string]any{"tenants": s.Tunnels()}
		if s.ha != nil {
			body["ha"] = s.ha.Status()
		}
		_ = json.NewEncoder(w).Encode(body)
	})
	return mux
}

// wireGuardSites is the state of a tenant's WireGuard sites, if it has any.
func (s *Server) wireGuardSites(t *tenant) []SiteStatus {
	if t.extras.wg == nil {
		return nil
	}
	states, err := t.extras.wg.Sites()
	if err != nil {
		s.log.Error("wireguard sites' state", "tenant", t.name, "error", err)
		return nil
	}
	var out []SiteStatus
	for _, st := range states {
		ss := SiteStatus{Kind: "wireguard", Name: st.Name, State: "down", BytesIn: st.RxBytes, BytesOut: st.TxBytes}
		if st.Endpoint.IsValid() {
			ss.Peer = st.Endpoint.String()
		}
		if st.Up {
			ss.State = "up"
		}
		for _, p := range st.Prefixes {
			ss.Prefixes = append(ss.Prefixes, p.String())
		}
		if !st.LastHandshake.IsZero() {
			at := st.LastHandshake.UTC()
			ss.LastHandshake = &at
		}
		out = append(out, ss)
	}
	return out
}
