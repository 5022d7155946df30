package ha

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Actions are what a gateway does when its role changes.
type Actions interface {
	// Promote makes this gateway the active one: it takes the addresses
	// over and tells the neighbours.
	Promote() error
	// Refresh is called at each renewal while active.
	Refresh() error
	// Demote gives the addresses up; it is called before the lease can
	// pass to the other gateway.
	Demote()
}

// Options are an Elector's settings.
type Options struct {
	DSN, Group, Node string
	// TTL is the lease's length; it is renewed every TTL/3.
	TTL      time.Duration
	Logger   *slog.Logger
	Registry prometheus.Registerer
}

// Status is a node's role for the admin API.
type Status struct {
	Group  string `json:"group"`
	Node   string `json:"node"`
	Role   string `json:"role"` // active or passive
	Holder string `json:"holder"`
	// Since is when the node took its present role.
	Since time.Time `json:"since"`
}

// Elector keeps a node's role in step with the lease.
type Elector struct {
	opt    Options
	log    *slog.Logger
	lease  *Lease
	act    Actions
	active prometheus.Gauge
	trans  *prometheus.CounterVec

	mu     sync.Mutex
	status Status
}

// New connects to the database lazily; nothing is taken before Run.
func New(ctx context.Context, opt Options, act Actions) (*Elector, error) {
	l, err := Open(ctx, opt.DSN, opt.Group, opt.Node, opt.TTL)
	if err != nil {
		return nil, err
	}
	reg := opt.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	e := &Elector{opt: opt, log: opt.Logger, lease: l, act: act,
		active: prometheus.NewGauge(prometheus.GaugeOpts{Name: "deskway_site_ha_active",
			Help: "1 while this gateway is the active one of its pair, 0 while passive."}),
		trans: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "deskway_site_ha_transitions_total",
			Help: "Role changes of this gateway, by the role taken (active, passive)."}, []string{"to"}),
		status: Status{Group: opt.Group, Node: opt.Node, Role: "passive", Since: time.Now().UTC()},
	}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	if err := reg.Register(e.active); err != nil {
		l.Close()
		return nil, fmt.Errorf("ha: metrics: %w", err)
	}
	if err := reg.Register(e.trans); err != nil {
		l.Close()
		return nil, fmt.Errorf("ha: metrics: %w", err)
	}
	e.trans.WithLabelValues("active")
	e.trans.WithLabelValues("passive")
	e.log = e.log.With("group", opt.Group, "node", opt.Node)
	return e, nil
}

// Status is the node's role now.
func (e *Elector) Status() Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.status
}

func (e *Elector) set(role, holder string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.status.Role != role {
		e.status.Since = time.Now().UTC()
		e.trans.WithLabelValues(role).Inc()
	}
	e.status.Role, e.status.Holder = role, holder
	if role == "active" {
		e.active.Set(1)
	} else {
		e.active.Set(0)
	}
}

// Run takes part in the election until ctx ends. Passive, it tries to
// take the lease every TTL/3; active, it renews it as often and demotes
// itself if a renewal has not succeeded by TTL×5/6 after the last good
// one began (the lease, timed by the database from a moment after that
// beginning, cannot have expired yet). On the way out an active node
// gives the addresses up and then releases the lease, so that the other
// takes over at its next attempt.
func (e *Elector) Run(ctx context.Context) error {
	defer e.lease.Close()
	tick := e.opt.TTL / 3
	for {
		if err := e.lease.prepare(ctx); err == nil {
			break
		} else if ctx.Err() != nil {
			return nil
		} else {
			e.log.Warn("the lease's database cannot be reached; passive until it can", "error", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(e.opt.TTL):
		}
	}
	e.log.Info("high availability: passive, watching the lease", "lease", e.opt.TTL.String())
	var deadline time.Time
	active := false
	for {
		start := time.Now()
		next := start.Add(tick)
		if active && deadline.Before(next) {
			next = deadline
		}
		actx, cancel := context.WithDeadline(ctx, next)
		held, prev, holder, err := e.lease.Acquire(actx)
		cancel()
		if ctx.Err() != nil {
			break
		}
		switch {
		case err == nil && held:
			deadline = start.Add(e.opt.TTL - e.opt.TTL/6)
			if active {
				if err := e.act.Refresh(); err != nil {
					e.log.Error("renewing the addresses' lifetimes", "error", err)
				}
				break
			}
			e.log.Info("took over as the active gateway", "from", prev.Holder, "why", why(prev, e.opt.Node))
			e.set("active", e.opt.Node)
			active = true
			if err := e.act.Promote(); err != nil {
				// A node that cannot hold the addresses leaves them to
				// the other one.
				e.log.Error("could not take the addresses over; handing the lease back", "error", err)
				e.demote("this gateway could not take the addresses over", holder)
				active = false
				_ = e.lease.Release(ctx)
				select {
				case <-ctx.Done():
				case <-time.After(2 * e.opt.TTL):
				}
			}
		case err == nil:
			if active {
				e.demote(fmt.Sprintf("the lease is held by %s", holder), holder)
				active = false
			} else {
				e.set("passive", holder)
			}
		default:
			if active && !time.Now().Before(deadline) {
				e.demote(fmt.Sprintf("the lease could not be renewed in time (%v)", err), "")
				active = false
			} else if !active {
				e.log.Debug("the lease's database cannot be reached", "error", err)
			}
		}
		wait := time.Until(start.Add(tick))
		if active {
			wait = min(wait, time.Until(deadline))
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		if ctx.Err() != nil {
			break
		}
	}
	if active {
		e.demote("stopping", "")
		rctx, cancel := context.WithTimeout(context.Background(), e.opt.TTL)
		defer cancel()
		if err := e.lease.Release(rctx); err != nil {
			e.log.Warn("could not release the lease; the other gateway takes over when it expires", "error", err)
		} else {
			e.log.Info("released the lease to the other gateway")
		}
	}
	return nil
}

func (e *Elector) demote(why, holder string) {
	e.act.Demote()
	e.set("passive", holder)
	e.log.Warn("no longer the active gateway: gave the addresses up", "why", why)
}

// why says in words how the lease came free.
func why(p Previous, node string) string {
	switch {
	case p.Holder == node:
		return "this gateway held the lease already (it restarted within the lease)"
	case p.Holder == "":
		return "no gateway held the lease"
	case p.Released:
		return p.Holder + " released the lease (it stopped)"
	default:
		return p.Holder + "'s lease expired: it stopped renewing (killed, hung or cut off from the database)"
	}
}
