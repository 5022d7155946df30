package brokerbench

// The rig of a storm: the simulated session hosts and the broker farm
// they report to.

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/bench/latency"
	"github.com/deskway/deskway/internal/broker"
	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/broker/store"
	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/tlsconf"
	"github.com/prometheus/client_golang/prometheus"
)

// simHost is one simulated session host: it registered through the agent
// API and reports, every LogonAfter, the logons of sessions placed on it.
type simHost struct {
	name, cred string
	mu         sync.Mutex
	queued     []string
	sessions   []brokerapi.Session
}

func (h *simHost) logon(user string) {
	h.mu.Lock()
	h.queued = append(h.queued, user)
	h.mu.Unlock()
}

func (h *simHost) run(ctx context.Context, c *brokerclient.Client, every, beat time.Duration, log *slog.Logger) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	// Hosts that registered together do not heartbeat in lockstep.
	select {
	case <-ctx.Done():
		return
	case <-time.After(time.Duration(rand.Int64N(int64(beat)))):
	}
	hb := time.NewTicker(beat)
	defer hb.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			h.mu.Lock()
			q := h.queued
			h.queued = nil
			h.mu.Unlock()
			if len(q) == 0 {
				continue
			}
			ev := brokerapi.Events{Host: h.name}
			for _, u := range q {
				ev.Events = append(ev.Events, brokerapi.Event{User: u, State: store.Active})
			}
			if err := c.Events(ctx, h.cred, ev); err != nil && ctx.Err() == nil {
				log.Warn("simulated host: events", "host", h.name, "error", err)
			}
			h.mu.Lock()
			for _, u := range q {
				h.sessions = append(h.sessions, brokerapi.Session{User: u, State: store.Active})
			}
			h.mu.Unlock()
		case <-hb.C:
			h.mu.Lock()
			ss := append([]brokerapi.Session{}, h.sessions...)
			h.mu.Unlock()
			_, err := c.Heartbeat(ctx, h.cred, brokerapi.Heartbeat{Host: h.name, CPU: 0.3, Memory: 0.4, DiskIdle: 0.9,
				DiskLatencyMS: 4, Sessions: ss})
			if err != nil && ctx.Err() == nil {
				log.Warn("simulated host: heartbeat", "host", h.name, "error", err)
			}
		}
	}
}

// farm is one point's broker, its database and the session hosts
// registered with it through the agent API.
type farm struct {
	client *brokerclient.Client
	creds  map[string]string // host name → credential
	st     *store.Store
	reg    *prometheus.Registry
	cfg    *config.Config
	hc     *http.Client
}

func (f *farm) close() {
	f.hc.CloseIdleConnections()
	f.st.Close()
}

// startFarm starts, until ctx ends, a broker on a fresh database (through
// a latency proxy of rtt when one is given) and registers o.Hosts hosts
// at once, as a farm's agents do when the broker starts. Its goroutines
// join wg.
func (o *Options) startFarm(ctx context.Context, wg *sync.WaitGroup, tmp, dsn, pgAddr string, rtt time.Duration, c, sessionLimit, logonLimit int) (*farm, error) {
	if rtt > 0 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		px := &latency.Proxy{Target: pgAddr, OneWay: rtt / 2}
		wg.Add(1)
		go func() { defer wg.Done(); _ = px.Serve(ctx, ln) }()
		dsn = strings.Replace(dsn, pgAddr, ln.Addr().String(), 1)
	}
	// Each point's broker keeps its own cache and journal: a journal left
	// by one point's teardown must not be written into the next's database.
	stateDir, err := os.MkdirTemp(tmp, "point-")
	if err != nil {
		return nil, err
	}
	cfg := &config.Config{StateDir: stateDir, Auth: config.Auth{TokenKey: config.NewSecret(tokenKey)},
		Broker: &config.Broker{Database: config.NewDatabaseURL(dsn), Gateway: "gateway.bench:443", MaxDBConnections: 2*c + 40,
			FrontendTokens: []config.Secret{config.NewSecret(frontendToken)},
			DeliveryGroups: []config.DeliveryGrp{{Name: group, Groups: []string{group}, SessionLimit: sessionLimit, LogonLimit: logonLimit}}}}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	st, err := store.Open(ctx, dsn, cfg.Broker.MaxDBConnections)
	if err != nil {
		return nil, err
	}
	f := &farm{st: st, cfg: cfg, reg: prometheus.NewRegistry(), creds: map[string]string{}}
	ok := false
	defer func() {
		if !ok {
			st.Close()
		}
	}()
	tokens, err := auth.NewTokens([]byte(tokenKey), nil)
	if err != nil {
		return nil, err
	}
	users, _ := auth.NewUsers(nil)
	b, err := broker.New(cfg.Broker, broker.Deps{Logger: o.BrokerLog.With("role", "broker"), Registry: f.reg, Users: users,
		Tokens: tokens, Store: st, StateDir: stateDir})
	if err != nil {
		return nil, err
	}
	if err := b.Start(ctx); err != nil {
		return nil, err
	}
	tc, err := tlsconf.Load(filepath.Join(tmp, "tls.crt"), filepath.Join(tmp, "tls.key"), tmp, nil)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	wg.Add(1)
	go func() { defer wg.Done(); _ = b.Serve(ctx, ln, tc) }()
	ctc, err := tlsconf.Trusting(filepath.Join(tmp, "tls.crt"))
	if err != nil {
		return nil, err
	}
	f.hc = &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{TLSClientConfig: ctc,
		MaxIdleConnsPerHost: 2*c + o.Hosts, MaxIdleConns: 2*c + o.Hosts}}
	f.client = &brokerclient.Client{Base: "https://" + ln.Addr().String(), HTTP: f.hc, MaxRetries: 1000}
	join, err := tokens.MintJoin(group, "", time.Hour, 0)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	var joined sync.WaitGroup
	regErr := make(chan error, o.Hosts)
	for i := range o.Hosts {
		joined.Add(1)
		go func() {
			defer joined.Done()
			name := fmt.Sprintf("vda%03d", i+1)
			r, err := f.client.Register(ctx, join, brokerapi.RegisterRequest{Name: name, Address: name + ".bench", Port: 3389})
			if err != nil {
				regErr <- fmt.Errorf("brokerbench: register %s: %w", name, err)
				return
			}
			if _, err := f.client.Heartbeat(ctx, r.Credential, brokerapi.Heartbeat{Host: name, DiskIdle: 0.9, Sessions: []brokerapi.Session{}}); err != nil {
				regErr <- err
				return
			}
			mu.Lock()
			f.creds[name] = r.Credential
			mu.Unlock()
		}()
	}
	joined.Wait()
	close(regErr)
	if err := <-regErr; err != nil {
		return nil, err
	}
	ok = true
	return f, nil
}
