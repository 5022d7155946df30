package gateway_test

import (
	"sync"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/proto/tsgu"
	"github.com/deskway/deskway/internal/testkit"
	"github.com/deskway/deskway/internal/tsgclient"
)

// dialAtOnce dials every configuration at the same moment and returns
// the tunnels that opened, which stay open until the test ends, and the
// errors of those that did not.
func dialAtOnce(t *testing.T, cfgs []tsgclient.Config, port uint16) ([]*tsgclient.Conn, []error) {
	t.Helper()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []*tsgclient.Conn
		errs  []error
	)
	gate := make(chan struct{})
	for _, cfg := range cfgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			c, err := dial(t, cfg, "127.0.0.1", port)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			conns = append(conns, c)
		}()
	}
	close(gate)
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	return conns, errs
}

// TestTokenNeverOpensTwoTunnelsAtOnce: a token allowed three tunnels
// (gateway.token_max_uses: 3), sent eight times at once from its own
// address, opens one; the seven others are refused because that one is
// open, not because the token is used up, and the token opens its next
// tunnel once the first has ended.
func TestTokenNeverOpensTwoTunnelsAtOnce(t *testing.T) {
	h := start(t, func(c *config.Config) {
		three := 3
		c.Gateway.TokenMaxUses = &three
		c.Gateway.HandshakeTimeout = config.Duration(30 * time.Second) // eight dials at once, on a loaded machine too
	})
	url := admin(t, h)
	tok := h.token(t, "bob", "127.0.0.1", h.echoPort, time.Minute)
	cfgs := make([]tsgclient.Config, 8)
	for i := range cfgs {
		cfgs[i] = h.cfg("", "", tsgclient.Websocket)
		cfgs[i].Token = tok
	}
	conns, errs := dialAtOnce(t, cfgs, h.echoPort)
	if len(conns) != 1 {
		t.Fatalf("eight tries at once with one token opened %d tunnels at once, want 1", len(conns))
	}
	for _, err := range errs {
		if statusOf(err) != tsgu.EProxyCookieAuthenticationDenied {
			t.Fatalf("a try while the token's tunnel was open: %v, want E_PROXY_COOKIE_AUTHENTICATION_ACCESS_DENIED", err)
		}
	}
	waitLogged(t, "token is in use by an open tunnel", 7, 2*time.Second, h)
	echoRoundTrip(t, conns[0], 10)
	conns[0].Close()
	waitGone(t, url, 4*time.Second, "after the client closed its tunnel")
	c, err := dial(t, cfgs[0], "127.0.0.1", h.echoPort)
	if err != nil {
		t.Fatalf("the token's second use, after its first tunnel ended: %v", err)
	}
	echoRoundTrip(t, c, 10)
	c.Close()
}

// TestFarmTokenNeverOpensTwoTunnelsAtOnce: with farm.database, a token
// allowed three tunnels, sent four times at once to each of two nodes,
// opens one tunnel in the whole farm; the seven others are refused
// because that one is open.
func TestFarmTokenNeverOpensTwoTunnelsAtOnce(t *testing.T) {
	pg := testkit.StartPostgres(t)
	dsn := pg.NewDB(t)
	nodes := startFarm(t, 2, func(c *config.Config) {
		c.Farm = &config.Farm{Database: config.NewSecret(dsn)}
		three := 3
		c.Gateway.TokenMaxUses = &three
		c.Gateway.HandshakeTimeout = config.Duration(30 * time.Second)
	})
	a, b := nodes[0], nodes[1]
	tok := a.token(t, "bob", "127.0.0.1", a.echoPort, time.Minute)
	var cfgs []tsgclient.Config
	for range 4 {
		for _, n := range nodes {
			cfg := n.cfg("", "", tsgclient.Websocket)
			cfg.Token = tok
			cfgs = append(cfgs, cfg)
		}
	}
	conns, errs := dialAtOnce(t, cfgs, a.echoPort)
	if len(conns) != 1 {
		t.Fatalf("eight tries at once with one token at two nodes opened %d tunnels at once, want 1", len(conns))
	}
	for _, err := range errs {
		if statusOf(err) != tsgu.EProxyCookieAuthenticationDenied {
			t.Fatalf("a try while the token's tunnel was open: %v, want E_PROXY_COOKIE_AUTHENTICATION_ACCESS_DENIED", err)
		}
	}
	waitLogged(t, "token is in use by an open tunnel (on this gateway farm)", 7, 2*time.Second, a, b)
	echoRoundTrip(t, conns[0], 10)
}
