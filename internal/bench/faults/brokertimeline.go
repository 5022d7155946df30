package faults

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/store"
)

// brokerCall is one request to a broker: when it was sent, to which
// (0 is the one the kill case kills), and how it failed, if it did.
type brokerCall struct {
	at     time.Time
	broker int
	err    string
}

func newBrokerCall(at time.Time, broker int, err error) brokerCall {
	c := brokerCall{at: at, broker: broker}
	if err != nil {
		c.err = err.Error()
	}
	return c
}

// at0 is the call as a timeline shows it, its time relative to t0.
func (c brokerCall) at0(t0 time.Time) string {
	out := fmt.Sprintf("broker %d at %+.3f s", c.broker+1, c.at.Sub(t0).Seconds())
	if c.err != "" {
		return out + " failed (" + c.err + ")"
	}
	return out + " ok"
}

// hostBeat is a heartbeat a simulated host sent, with the users it named.
type hostBeat struct {
	brokerCall
	users []string
}

// hostPost is an event a simulated host reported.
type hostPost struct {
	brokerCall
	state string
}

// posted records an event report of the users ev names.
func (h *simHost) posted(ev []brokerapi.Event, c brokerCall) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, e := range ev {
		h.posts[e.User] = append(h.posts[e.User], hostPost{brokerCall: c, state: e.State})
	}
}

// beat records a heartbeat naming sessions.
func (h *simHost) beat(sessions []brokerapi.Session, c brokerCall) {
	users := make([]string, len(sessions))
	for i, s := range sessions {
		users[i] = s.User
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.beats = append(h.beats, hostBeat{brokerCall: c, users: users})
}

// userTimelines tells, for the first few of users (found lost, or
// doubled), what happened to their launches relative to the fault at t0:
// the broker requests each launch made, the host it was answered with,
// when the session logged on at each such host, the host's reports of it
// and to which broker each went, and the user's records in the database.
// A doubled user's two launches show which broker placed each and
// whether the second broker had had a report of the first session.
func userTimelines(ctx context.Context, f *brokerFarm, dsn string, recs []*launchRec, users []string, t0 time.Time) ([]string, error) {
	if len(users) == 0 {
		return nil, nil
	}
	st, err := store.Connect(dsn, 2)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	var out []string
	for _, u := range users[:min(3, len(users))] {
		var b strings.Builder
		fmt.Fprintf(&b, "Timeline of %s (fault at 0 s):", u)
		var hosts []string
		for _, r := range recs {
			if r.user != u {
				continue
			}
			for _, c := range r.tries {
				fmt.Fprintf(&b, " launch to %s;", c.at0(t0))
			}
			if r.ok {
				fmt.Fprintf(&b, " answered %s;", r.host)
				if !slices.Contains(hosts, r.host) {
					hosts = append(hosts, r.host)
				}
			}
		}
		for _, host := range hosts {
			h := f.hosts[host]
			if h == nil {
				continue
			}
			h.mu.Lock()
			s, on := h.sessions[u]
			if on {
				fmt.Fprintf(&b, " on %s logged on at %+.3f s;", host, s.showAt.Sub(t0).Seconds())
			} else {
				fmt.Fprintf(&b, " %s has no session of the user;", host)
			}
			for _, p := range h.posts[u] {
				fmt.Fprintf(&b, " event %s from %s to %s;", p.state, host, p.at0(t0))
			}
			// The heartbeats around the logon: whether each named the user.
			if on {
				for _, hb := range h.beats {
					if d := hb.at.Sub(s.showAt); d > -2*time.Second && d < 4*time.Second {
						fmt.Fprintf(&b, " heartbeat of %s %s to %s;", host, map[bool]string{true: "with", false: "without"}[slices.Contains(hb.users, u)], hb.at0(t0))
					}
				}
			}
			h.mu.Unlock()
		}
		rows, err := st.Sessions(ctx, u, true, 100)
		if err != nil {
			return nil, err
		}
		b.WriteString(" database:")
		for _, s := range rows {
			fmt.Fprintf(&b, " [%s on %s %s verified=%t created %+.3f s updated %+.3f s]", s.ID, s.Host, s.State, !s.Unverified,
				s.CreatedAt.Sub(t0).Seconds(), s.UpdatedAt.Sub(t0).Seconds())
		}
		out = append(out, b.String()+".")
	}
	return out, nil
}
