package broker

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/store"
	"github.com/deskway/deskway/internal/obs"
)

// maxEntitled bounds the names of one entitlement list: a launch checks
// them all.
const maxEntitled = 1000

// setEntitlements puts in force the entitlements administrators set, as
// the database (or, in an outage at start, the saved cache) holds them,
// and keeps them with the local host cache for a restart.
func (s *Server) setEntitlements(es []store.Entitlement) {
	s.groupsMu.Lock()
	defer s.groupsMu.Unlock()
	s.setEntitlementsLocked(es)
}

// setEntitlementsLocked is setEntitlements with groupsMu held.
func (s *Server) setEntitlementsLocked(es []store.Entitlement) {
	s.cache.setEntitlements(es)
	if slices.EqualFunc(es, s.entitled, sameEntitlement) {
		return
	}
	old := s.groups.Load()
	gs := newGroupSet(s.configured, es)
	for _, g := range gs.list {
		before := old.byName[g.Name]
		if before != nil && slices.Equal(before.Users, g.Users) && slices.Equal(before.Groups, g.Groups) {
			continue
		}
		from, by := "configuration", ""
		if e, ok := gs.set[g.Name]; ok {
			from, by = "admin", e.SetBy
		}
		s.log.Info("delivery group entitlements in force", "delivery_group", g.Name, "users", g.Users, "groups", g.Groups, "from", from, "set_by", by)
	}
	for _, e := range es {
		if _, ok := gs.byName[e.Group]; !ok && !slices.ContainsFunc(s.entitled, func(o store.Entitlement) bool { return o.Group == e.Group }) {
			s.log.Warn("an entitlement set through the admin API names a delivery group the configuration no longer has; it applies again if the group comes back (clear it with deskway group entitle GROUP --configured first)",
				"delivery_group", e.Group, "set_by", e.SetBy)
		}
	}
	s.entitled = es
	s.groups.Store(gs)
}

// loadEntitlements reads the entitlements from the database and puts
// them in force, reading under groupsMu: a refresh that read before a
// change was stored cannot put its older list in force after the change's
// own read.
func (s *Server) loadEntitlements(ctx context.Context) error {
	s.groupsMu.Lock()
	defer s.groupsMu.Unlock()
	es, err := s.store.Entitlements(ctx)
	if err != nil {
		return err
	}
	s.setEntitlementsLocked(es)
	return nil
}

func sameEntitlement(a, b store.Entitlement) bool {
	return a.Group == b.Group && slices.Equal(a.Users, b.Users) && slices.Equal(a.Groups, b.Groups) && a.SetBy == b.SetBy && a.SetAt.Equal(b.SetAt)
}

// reloadEntitlements reads the entitlements from the database and puts
// them in force at once, so the broker that changed them answers with
// the change; the others read it on their next refresh.
func (s *Server) reloadEntitlements(r *http.Request) error {
	if err := s.loadEntitlements(r.Context()); err != nil {
		return err
	}
	// Saved at once: a restart in an outage must not bring back a
	// desktop an administrator just took away.
	if err := s.cache.save(s.now()); err != nil {
		s.log.Warn("could not save the local host cache with the new entitlements", "error", err)
	}
	return nil
}

// entitlementNames checks and tidies one list of an entitlement request:
// names trimmed, none empty or over 256 bytes or holding control
// characters, each once (without regard to case), at most maxEntitled.
func entitlementNames(kind string, in []string) ([]string, error) {
	if len(in) > maxEntitled {
		return nil, fmt.Errorf("%d %s: at most %d; entitle a group instead", len(in), kind, maxEntitled)
	}
	out := make([]string, 0, len(in))
	for _, n := range in {
		n = strings.TrimSpace(n)
		switch {
		case n == "":
			return nil, fmt.Errorf("an empty name among the %s", kind)
		case len(n) > 256:
			return nil, fmt.Errorf("a name among the %s is over 256 bytes", kind)
		case !utf8.ValidString(n) || strings.ContainsFunc(n, unicode.IsControl):
			return nil, fmt.Errorf("the name %q among the %s holds a control character or invalid UTF-8", n, kind)
		}
		if !slices.ContainsFunc(out, func(o string) bool { return strings.EqualFold(o, n) }) {
			out = append(out, n)
		}
	}
	return out, nil
}

// adminGroups lists the delivery groups with their entitlements in force.
func (s *Server) adminGroups(w http.ResponseWriter, _ *http.Request) {
	gs := s.groups.Load()
	out := make([]brokerapi.DeliveryGroup, 0, len(gs.list))
	for _, g := range gs.list {
		out = append(out, gs.view(g.Name))
	}
	writeJSON(w, http.StatusOK, out)
}

// view is group name as the admin API shows it.
func (gs *groupSet) view(name string) brokerapi.DeliveryGroup {
	g, c := gs.byName[name], gs.configured[name]
	d := brokerapi.DeliveryGroup{Name: g.Name, Description: g.Description, Kind: g.Kind, Spread: g.Spread,
		Users: nonNil(g.Users), Groups: nonNil(g.Groups), SessionLimit: g.SessionLimit, LogonLimit: g.LogonLimit,
		EntitlementsFrom: "configuration", ConfiguredUsers: nonNil(c.Users), ConfiguredGroups: nonNil(c.Groups)}
	if e, ok := gs.set[name]; ok {
		at := e.SetAt
		d.EntitlementsFrom, d.SetBy, d.SetAt = "admin", e.SetBy, &at
	}
	return d
}

// setEntitlement answers PUT /api/v1/broker/groups/{name}/entitlements:
// who may launch the group from now on, on every broker of the database.
func (s *Server) setEntitlement(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if _, ok := s.groups.Load().byName[name]; !ok {
		s.fail(w, r, http.StatusNotFound, "no delivery group %q in this broker's configuration", name)
		return
	}
	var req brokerapi.EntitlementRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, http.StatusBadRequest, "%v", err)
		return
	}
	users, err := entitlementNames("users", req.Users)
	if err == nil {
		req.Groups, err = entitlementNames("groups", req.Groups)
	}
	if err != nil {
		s.fail(w, r, http.StatusBadRequest, "%v", err)
		return
	}
	if len(users) == 0 && len(req.Groups) == 0 {
		s.fail(w, r, http.StatusBadRequest, "the entitlement names no user and no group, so nobody could launch %q: drain its hosts to stop launches", name)
		return
	}
	by := obs.Actor(r.Context())
	if by == "" {
		by = "admin API"
	}
	e := store.Entitlement{Group: name, Users: users, Groups: req.Groups, SetBy: by, SetAt: s.now().UTC()}
	dctx, cancel := dbCall(r.Context())
	defer cancel()
	if err := s.store.SetEntitlement(dctx, e); err != nil {
		s.fail(w, r, http.StatusServiceUnavailable, "entitlements are kept in the broker's database, which did not take them: %v", err)
		return
	}
	if err := s.reloadEntitlements(r); err != nil {
		s.fail(w, r, http.StatusServiceUnavailable, "the entitlements were stored but could not be read back; every broker reads them within %s: %v", cacheRefresh, err)
		return
	}
	s.log.Info("delivery group entitlements set", "delivery_group", name, "users", users, "groups", req.Groups, "by", by)
	s.adminGroup(w, r, name)
}

// clearEntitlement answers DELETE /api/v1/broker/groups/{name}/entitlements:
// the group's configured users and groups apply again.
func (s *Server) clearEntitlement(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if _, ok := s.groups.Load().byName[name]; !ok {
		s.fail(w, r, http.StatusNotFound, "no delivery group %q in this broker's configuration", name)
		return
	}
	dctx, cancel := dbCall(r.Context())
	defer cancel()
	had, err := s.store.ClearEntitlement(dctx, name)
	if err == nil {
		err = s.reloadEntitlements(r)
	}
	if err != nil {
		s.fail(w, r, http.StatusServiceUnavailable, "entitlements are kept in the broker's database, which did not answer: %v", err)
		return
	}
	if had {
		s.log.Info("delivery group entitlements cleared: the configuration's apply", "delivery_group", name, "by", obs.Actor(r.Context()))
	}
	s.adminGroup(w, r, name)
}

// adminGroup answers with group name as it is now in force, or 404 when
// a reload removed it meanwhile.
func (s *Server) adminGroup(w http.ResponseWriter, r *http.Request, name string) {
	gs := s.groups.Load()
	if _, ok := gs.byName[name]; !ok {
		s.fail(w, r, http.StatusNotFound, "no delivery group %q in this broker's configuration", name)
		return
	}
	writeJSON(w, http.StatusOK, gs.view(name))
}

func nonNil(v []string) []string {
	if v == nil {
		return []string{}
	}
	return v
}
