package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
)

// adminTunnel is one tunnel as a node's admin API lists it.
type adminTunnel struct {
	ID        uint32 `json:"id"`
	User      string `json:"user"`
	Transport string `json:"transport"`
	Open      bool   `json:"channel_open"`
	BytesUp   uint64 `json:"bytes_up"`
	BytesDown uint64 `json:"bytes_down"`
}

// nodeTunnels is node i's tunnels, from its admin API.
func (r *gwRig) nodeTunnels(ctx context.Context, i int) ([]adminTunnel, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+r.nodes[i].admin+"/api/v1/gateway/tunnels", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+r.adminToken)
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("faults: %s's tunnels: %w", r.nodes[i].name, err)
	}
	defer resp.Body.Close()
	var body struct {
		Tunnels []adminTunnel `json:"tunnels"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&body); err != nil {
		return nil, fmt.Errorf("faults: %s's tunnels: %s: %w", r.nodes[i].name, resp.Status, err)
	}
	return body.Tunnels, nil
}

// tunnelsOn is the users with an open tunnel on node i.
func (r *gwRig) tunnelsOn(ctx context.Context, i int) (map[string]bool, error) {
	tunnels, err := r.nodeTunnels(ctx, i)
	if err != nil {
		return nil, err
	}
	on := map[string]bool{}
	for _, t := range tunnels {
		if t.Open {
			on[t.User] = true
		}
	}
	return on, nil
}

// relayWindow is how long the relay of a client that did not come back
// is watched.
const relayWindow = 3 * time.Second

// relayed says, for each user, what the nodes relayed for their tunnels
// over relayWindow: whether the gateway still carries the host's bytes
// to a client whose screen shows no frame (the client or xrdp then holds
// them up) or carries none (the host sends none, or the gateway holds
// them); and whether an open tunnel of theirs carried bytes to them.
func (r *gwRig) relayed(ctx context.Context, users []string) (map[string]string, map[string]bool) {
	type key struct {
		node int
		id   uint32
	}
	sample := func() (map[key]adminTunnel, []string) {
		got := map[key]adminTunnel{}
		var errs []string
		for i := range r.nodes {
			tunnels, err := r.nodeTunnels(ctx, i)
			if err != nil {
				errs = append(errs, err.Error())
				continue
			}
			for _, t := range tunnels {
				got[key{i, t.ID}] = t
			}
		}
		return got, errs
	}
	before, _ := sample()
	select {
	case <-ctx.Done():
	case <-time.After(relayWindow):
	}
	after, errs := sample()
	out := map[string]string{}
	carrying := map[string]bool{}
	for _, u := range users {
		var lines []string
		for k, t := range after {
			if t.User != u {
				continue
			}
			b := before[k]
			if t.Open && t.BytesDown > b.BytesDown {
				carrying[u] = true
			}
			lines = append(lines, fmt.Sprintf("%s tunnel %d (%s, open %v): %d bytes to the client and %d from it in the last %v, %d and %d in all",
				r.nodes[k.node].name, t.ID, t.Transport, t.Open, t.BytesDown-b.BytesDown, t.BytesUp-b.BytesUp, relayWindow, t.BytesDown, t.BytesUp))
		}
		slices.Sort(lines)
		if len(lines) == 0 {
			lines = append(lines, "no tunnel on any node")
		}
		out[u] = strings.Join(append(lines, errs...), "; ")
	}
	return out, carrying
}

// tunnelShares are the "tunnel open" lines of a node's log, each tunnel
// at the same index in both.
type tunnelShares struct {
	// open is open_ms: from accepting the tunnel's first connection
	// (before TLS) to its channel open, the client's pauses between its
	// requests included.
	open []float64
	// served is served_ms: the gateway's own working time within it,
	// from holding each of the tunnel's requests to having written its
	// reply, the dial to the host included.
	served []float64
}

// openShares reads the "tunnel open" lines a node's JSON log gained
// after its first from bytes: the gateway's share of each client's wait.
func openShares(log string, from int) tunnelShares {
	var sh tunnelShares
	if from > len(log) {
		return sh
	}
	for _, line := range strings.Split(log[from:], "\n") {
		if !strings.Contains(line, `"msg":"tunnel open"`) {
			continue
		}
		var rec struct {
			OpenMS   *float64 `json:"open_ms"`
			ServedMS float64  `json:"served_ms"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.OpenMS != nil {
			sh.open = append(sh.open, *rec.OpenMS)
			sh.served = append(sh.served, rec.ServedMS)
		}
	}
	return sh
}
