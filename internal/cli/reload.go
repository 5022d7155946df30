package cli

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/broker"
	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/gateway"
	"github.com/deskway/deskway/internal/obs"
	"github.com/deskway/deskway/internal/policy"
	"github.com/deskway/deskway/internal/site"
)

// reloader re-reads the configuration file and puts its users, gateway
// policies, broker delivery groups and peer brokers in force without a
// restart. The whole file is validated and every part built before
// anything changes: a file with a mistake changes nothing, and the log
// and the answer say why. Everything else in the file takes effect at
// the next start.
type reloader struct {
	path string
	log  *slog.Logger
	// audit is the admin API's audit trail, where a change to the peer
	// brokers is written as the site gateway's changes are; nil without
	// a broker or site role.
	audit   obs.AuditLog
	gateway *gateway.Server // nil when the role does not run
	broker  *broker.Server
	site    *site.Server
	// portal is the users the portal signs people in with; nil without
	// the web role.
	portal *auth.Users
	// fileGateway and fileBroker: the file had the section when the
	// process started (it may run only some of the roles in it).
	fileGateway, fileBroker bool

	mu      sync.Mutex     // one reload at a time
	running *config.Config // what is in force
}

func (r *reloader) reload(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	err := r.apply(ctx)
	if err != nil {
		r.log.Error("configuration reload refused; the running configuration stays", "file", r.path, "error", err)
		if r.site != nil && !errors.Is(err, errPartial) {
			actor, source := reloadActor(ctx)
			r.site.Refused(actor, source, err)
		}
		return err
	}
	what := "users, gateway policies and delivery groups"
	if r.broker != nil {
		what += ", peer brokers"
	}
	if r.site != nil {
		what += ", site tenants and sites"
	}
	r.log.Info("configuration reloaded: "+what, "file", r.path)
	return nil
}

func (r *reloader) apply(ctx context.Context) error {
	next, err := config.Load(r.path)
	if err != nil {
		return err
	}
	// A section for a role this process does not run is another
	// process's (deskway gateway and deskway broker read the whole file);
	// removing the section of one it runs, or adding one the file did
	// not have, takes a restart.
	if (r.gateway != nil && next.Gateway == nil) || (r.broker != nil && next.Broker == nil) {
		return errors.New("the file removes the gateway or broker section this process runs: roles change only at a restart")
	}
	if (!r.fileGateway && next.Gateway != nil) || (!r.fileBroker && next.Broker != nil) {
		return errors.New("the file adds a gateway or broker section: roles change only at a restart")
	}
	// Keys and tokens change only at a restart; a reload that seemed to
	// revoke a leaked one, and did not, would be worse than a refusal.
	if what := changedSecrets(r.running, next); what != "" {
		return fmt.Errorf("%s changed, which takes a restart (nothing was reloaded)", what)
	}
	if r.site != nil {
		if next.Site == nil {
			return errors.New("the file removes the site section this process runs: roles change only at a restart")
		}
		// The site gateway's admin API is where its tunnels are seen and
		// its reloads asked for: moving it silently would lose both.
		if next.Admin.Listen != r.running.Admin.Listen {
			return fmt.Errorf("admin.listen changes only at a restart (it is %s)", r.running.Admin.Listen)
		}
		if err := r.site.Check(next.Site); err != nil {
			return err
		}
	}
	users, err := auth.NewUsers(next.Auth.Users)
	if err != nil {
		return err
	}
	users.WithDesktops(next.Auth.DesktopAccounts)
	var pol *policy.Engine
	if r.gateway != nil {
		if pol, err = policy.New(next.Gateway, nil); err != nil {
			return err
		}
	}
	var peerTLS *tls.Config
	if r.broker != nil {
		if peerTLS, err = brokerPeerTLS(next); err != nil {
			return err
		}
	}
	// The broker first: writing its groups is the one step that can fail.
	if r.broker != nil {
		if err := r.broker.Reload(ctx, next.Broker, users); err != nil {
			return err
		}
		if what := r.broker.SetPeers(next.Broker, peerTLS); what != "" {
			r.audited(ctx, "broker peers reloaded: "+what)
		}
	}
	if r.gateway != nil {
		r.gateway.Reload(users, pol)
	}
	if r.portal != nil {
		r.portal.Replace(users)
	}
	r.running = next
	if r.site != nil {
		actor, source := reloadActor(ctx)
		if err := r.site.Reload(next.Site, actor, source); err != nil {
			return fmt.Errorf("%w: %w", errPartial, err)
		}
	}
	return nil
}

// audited writes a change a reload made to the audit trail, as the
// reload's asker's (an admin's token, or SIGHUP), in the form of the
// administrators' own actions. The log line of the change keeps it
// should the trail not take it (its database away).
func (r *reloader) audited(ctx context.Context, action string) {
	if r.audit == nil {
		return
	}
	actor, source := reloadActor(ctx)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	e := obs.AuditEntry{Time: time.Now().UTC(), Actor: actor, Action: action, Source: source, Status: http.StatusOK}
	if err := r.audit.Record(ctx, e); err != nil {
		r.log.Warn("could not write a reload's change to the audit trail; the log line of the change keeps it", "action", action, "error", err)
	}
}

// errPartial is a reload the site gateway applied in part: each change
// is in the audit trail already.
var errPartial = errors.New("the site gateway applied the file in part")

// reloadActor is who asked for the reload, as the audit trail names
// them: an admin's reload is theirs; a signal's is nobody's in
// particular.
func reloadActor(ctx context.Context) (actor, source string) {
	if actor := obs.Actor(ctx); actor != "" {
		return actor, ""
	}
	return "reload (SIGHUP)", "SIGHUP"
}

// changedSecrets names the keys and tokens that differ between a and b.
func changedSecrets(a, b *config.Config) string {
	values := func(ss []config.Secret) string {
		var out []string
		for _, s := range ss {
			out = append(out, s.Value())
		}
		return strings.Join(out, "\x00")
	}
	var changed []string
	if a.Auth.TokenKey.Value() != b.Auth.TokenKey.Value() {
		changed = append(changed, "auth.token_key")
	}
	if values(a.Admin.Tokens) != values(b.Admin.Tokens) {
		changed = append(changed, "admin.tokens")
	}
	if values(a.Admin.ConsoleTokens) != values(b.Admin.ConsoleTokens) {
		changed = append(changed, "admin.console_tokens")
	}
	if a.Broker != nil && b.Broker != nil && values(a.Broker.FrontendTokens) != values(b.Broker.FrontendTokens) {
		changed = append(changed, "broker.frontend_tokens")
	}
	return strings.Join(changed, ", ")
}

// watchSIGHUP starts taking SIGHUP now (its default is to end the
// process), and returns the loop that reloads on each until ctx ends and
// the stop that gives SIGHUP back. One that arrives before the loop runs
// waits for it.
func (r *reloader) watchSIGHUP() (loop func(context.Context) error, stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGHUP)
	stop = func() { signal.Stop(ch) }
	return func(ctx context.Context) error {
		defer stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-ch:
				_ = r.reload(ctx)
			}
		}
	}, stop
}

// adminHandler serves POST /api/v1/reload on the admin API.
func (r *reloader) adminHandler() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/v1/reload", func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if err := r.reload(req.Context()); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": fmt.Sprintf("reload refused, the running configuration stays: %v", err)})
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"reloaded": r.path})
	})
	return mux
}
