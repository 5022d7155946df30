package config

import (
	"fmt"
	"maps"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Web is the user portal: sign-in, the desktops a user may launch, and
// .rdp files for them, served over HTTPS by the binary itself.
type Web struct {
	Listen string `yaml:"listen"`
	// Title names the portal on its pages.
	Title string `yaml:"title"`
	// Broker is the broker's URL the portal calls as a front end; empty
	// means this config's broker, which the portal then calls inside the
	// process when both run in it.
	Broker string `yaml:"broker"`
	// localBroker is set when Broker was empty and filled in with this
	// config's broker.
	localBroker bool
	// BrokerCA is the PEM file the broker's certificate is checked
	// against; empty means this deskway's own certificate.
	BrokerCA string `yaml:"broker_ca"`
	// FrontendToken authenticates the portal to the broker; empty means
	// this config's first broker.frontend_tokens entry.
	FrontendToken Secret `yaml:"frontend_token"`
	// CookieKey signs sign-in cookies (at least 32 bytes); every portal
	// of a farm needs the same. Empty means a key made in the state
	// directory on first start.
	CookieKey Secret `yaml:"cookie_key"`
	// SessionIdle ends a sign-in after that long without a request;
	// SessionMax ends it that long after sign-in, whatever happens.
	SessionIdle Duration `yaml:"session_idle"`
	SessionMax  Duration `yaml:"session_max"`
	// PublicURL is where people reach the portal (https://host[:port]);
	// an identity provider sends them back under it.
	PublicURL string `yaml:"public_url"`
	// OIDC signs people in through an OpenID Connect provider, beside
	// the local users.
	OIDC *OIDC `yaml:"oidc"`
	// Console is the admin console at /admin: who may use it, and the
	// admin API it acts through.
	Console *Console `yaml:"console"`
	// LDAP checks the passwords of people who are not local users
	// against a directory (OpenLDAP, Active Directory), whose groups,
	// nested ones included, become theirs.
	LDAP *LDAP `yaml:"ldap"`
}

// Console is the admin console. People sign in as to the portal; the
// groups they are in give their role: admins may do everything, helpdesk
// may read and control sessions, readonly may read.
type Console struct {
	Admins   []string `yaml:"admins"`
	Helpdesk []string `yaml:"helpdesk"`
	ReadOnly []string `yaml:"readonly"`
	// API is the admin API's URL; empty means this config's admin.listen.
	API string `yaml:"api"`
	// APICA is the PEM file its certificate is checked against; empty
	// means this deskway's own certificate.
	APICA string `yaml:"api_ca"`
	// Token is the credential the console acts with: one of the
	// admin.console_tokens of the deskway at API. Empty means this
	// config's first admin.console_tokens entry or, with neither, one made
	// at each start that only this process's admin API accepts. Every
	// action is audited as the token's and the person's.
	Token Secret `yaml:"token"`
	// localAPI is set when API was empty and filled in with this
	// config's admin listener.
	localAPI bool
}

// LocalAPI says the console's admin API is this config's own
// (web.console.api was left empty).
func (cn *Console) LocalAPI() bool { return cn.localAPI }

// LDAP is a directory the portal signs people in against: it finds the
// user with a reader account, binds as the user to check the password,
// then collects the groups whose members hold the user, and the groups
// holding those.
type LDAP struct {
	// URL is ldap://HOST[:389] or ldaps://HOST[:636].
	URL string `yaml:"url"`
	// StartTLS upgrades an ldap:// connection before any bind.
	StartTLS bool `yaml:"start_tls"`
	// CA is a PEM file the directory's certificate is checked against.
	CA           string `yaml:"ca"`
	BindDN       string `yaml:"bind_dn"`
	BindPassword Secret `yaml:"bind_password"`
	BaseDN       string `yaml:"base_dn"`
	// UserFilter finds the user; {user} is the name typed, escaped.
	// Active Directory: (sAMAccountName={user}).
	UserFilter string `yaml:"user_filter"`
	// GroupBaseDN is where groups are searched (default: base_dn).
	GroupBaseDN string `yaml:"group_base_dn"`
	// GroupFilter finds the groups with a member; {dn} is the member's
	// DN, escaped. Active Directory: (&(objectClass=group)(member={dn})).
	GroupFilter string `yaml:"group_filter"`
	// GroupNameAttribute is the group's name as entitlements use it.
	GroupNameAttribute string `yaml:"group_name_attribute"`
	// UsernameAttribute is the user's name as the portal shows it and
	// the broker keys sessions by (default: the name typed).
	UsernameAttribute string `yaml:"username_attribute"`
}

// OIDC is an OpenID Connect provider the portal signs people in with
// (authorization code with PKCE). Its groups claim gives the groups that
// entitlements and gateway policies name.
type OIDC struct {
	Issuer       string `yaml:"issuer"`
	ClientID     string `yaml:"client_id"`
	ClientSecret Secret `yaml:"client_secret"`
	// CA is a PEM file the provider's certificate is checked against;
	// empty means the system's roots.
	CA string `yaml:"ca"`
	// Scopes asked for beside openid.
	Scopes []string `yaml:"scopes"`
	// UsernameClaim and GroupsClaim name the claims read from the ID
	// token (or, when absent there, from the userinfo endpoint).
	UsernameClaim string `yaml:"username_claim"`
	GroupsClaim   string `yaml:"groups_claim"`
	// Label is the sign-in button's text.
	Label string `yaml:"label"`
	// Namespace is what a provider user's name is qualified with,
	// USERNAME@NAMESPACE, so that they are never a directory user or a
	// user of another provider by the same name (default: the issuer's
	// host name).
	Namespace string `yaml:"namespace"`
	// Accounts maps a provider user's subject (the ID token's sub) to the
	// account they sign in as instead: how an operator says that a
	// provider user is the directory user or desktop account of that name.
	Accounts map[string]string `yaml:"accounts"`
}

func (c *Config) webDefaults(w *Web) {
	setDefault(&w.Listen, ":8446")
	if cn := w.Console; cn != nil {
		if cn.API == "" {
			if host, port, err := net.SplitHostPort(c.Admin.Listen); err == nil {
				if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
					host = "127.0.0.1"
				}
				cn.API = "https://" + net.JoinHostPort(host, port)
				cn.localAPI = true
			}
		}
		if !cn.Token.IsSet() && len(c.Admin.ConsoleTokens) > 0 {
			cn.Token = c.Admin.ConsoleTokens[0]
		}
	}
	if l := w.LDAP; l != nil {
		setDefault(&l.UserFilter, "(&(objectClass=person)(uid={user}))")
		setDefault(&l.GroupBaseDN, l.BaseDN)
		setDefault(&l.GroupFilter, "(&(objectClass=groupOfNames)(member={dn}))")
		setDefault(&l.GroupNameAttribute, "cn")
	}
	if o := w.OIDC; o != nil {
		if o.Scopes == nil {
			o.Scopes = []string{"profile", "email", "groups"}
		}
		setDefault(&o.UsernameClaim, "preferred_username")
		setDefault(&o.GroupsClaim, "groups")
		setDefault(&o.Label, "Sign in with your organisation")
		if u, err := url.Parse(o.Issuer); err == nil {
			setDefault(&o.Namespace, u.Hostname())
		}
	}
	setDefault(&w.Title, "Deskway")
	setDefault(&w.SessionIdle, Duration(30*time.Minute))
	setDefault(&w.SessionMax, Duration(12*time.Hour))
	if b := c.Broker; b != nil {
		if w.Broker == "" {
			host, port, err := net.SplitHostPort(b.Listen)
			if err == nil {
				if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
					host = "127.0.0.1"
				}
				w.Broker = "https://" + net.JoinHostPort(host, port)
				w.localBroker = true
			}
		}
		if !w.FrontendToken.IsSet() && len(b.FrontendTokens) > 0 {
			w.FrontendToken = b.FrontendTokens[0]
		}
	}
}

// LocalBroker says the portal's broker is this config's own (web.broker
// was left empty), so a process running both can connect them directly.
func (w *Web) LocalBroker() bool { return w.localBroker }

func isControl(c rune) bool { return c < ' ' || c == 0x7f }

// inNamespace reports whether name is USER@NAMESPACE, the form web.oidc
// gives the provider's users.
func inNamespace(name, namespace string) bool {
	return namespace != "" && len(name) > len(namespace)+1 && strings.EqualFold(name[len(name)-len(namespace)-1:], "@"+namespace)
}

// userFilterAttribute is the (ATTRIBUTE={user}) a user filter needs.
var userFilterAttribute = regexp.MustCompile(`\([A-Za-z][A-Za-z0-9;-]*=\{user\}\)`)

func (c *Config) validateWeb(w *Web, bad func(string, string, ...any)) {
	checkListen(bad, "web.listen", w.Listen)
	if u, err := url.Parse(w.Broker); err != nil || u.Scheme != "https" || u.Host == "" {
		bad("web.broker", "%q is not an https:// URL (leave it empty to use this config's broker)", w.Broker)
	} else if c.src.has("web.broker") {
		// The default, this config's broker, is called inside the
		// process when its listener has port 0.
		checkURLHost(bad, "web.broker", w.Broker)
	}
	c.checkCAFile(bad, "web.broker_ca", w.BrokerCA)
	if !w.FrontendToken.IsSet() {
		bad("web.frontend_token", "is empty: set it, or add broker.frontend_tokens to this config")
	}
	if w.CookieKey.IsSet() && len(w.CookieKey.Value()) < 32 {
		bad("web.cookie_key", "is %d bytes; use at least 32 random bytes", len(w.CookieKey.Value()))
	}
	if o := w.OIDC; o != nil {
		if u, err := url.Parse(o.Issuer); err != nil || u.Scheme != "https" || u.Host == "" {
			bad("web.oidc.issuer", "%q is not an https:// URL", o.Issuer)
		} else {
			checkURLHost(bad, "web.oidc.issuer", o.Issuer)
		}
		c.checkCAFile(bad, "web.oidc.ca", o.CA)
		if o.ClientID == "" {
			bad("web.oidc.client_id", "is empty: the client id the provider gave this portal")
		}
		if o.Namespace == "" || strings.ContainsAny(o.Namespace, "@\\/ ") || strings.ContainsFunc(o.Namespace, isControl) {
			bad("web.oidc.namespace", "%q is not a name to qualify provider users with (USER@NAMESPACE): no spaces, @, \\ or /", o.Namespace)
		}
		for _, sub := range slices.Sorted(maps.Keys(o.Accounts)) {
			if account := o.Accounts[sub]; sub == "" || account == "" || account != strings.TrimSpace(account) || strings.ContainsFunc(account, isControl) || len(account) > 256 {
				bad("web.oidc.accounts", "%q: %q is not a subject mapped to an account name", sub, account)
			} else if inNamespace(account, o.Namespace) {
				bad("web.oidc.accounts", "%q: %q ends in @%s, the form of the provider's own users' names: map the subject to the account's name as the desktops know it", sub, account, o.Namespace)
			}
		}
		if u, err := url.Parse(w.PublicURL); err != nil || u.Scheme != "https" || u.Host == "" || (u.Path != "" && u.Path != "/") {
			bad("web.public_url", "%q is not https://HOST[:PORT]: OIDC needs it for the address the provider sends people back to (PUBLIC_URL/oidc/callback)", w.PublicURL)
		} else {
			checkURLHost(bad, "web.public_url", w.PublicURL)
		}
	}
	if cn := w.Console; cn != nil {
		if len(cn.Admins)+len(cn.Helpdesk)+len(cn.ReadOnly) == 0 {
			bad("web.console", "names no group in admins, helpdesk or readonly: nobody could use it")
		}
		if u, err := url.Parse(cn.API); err != nil || u.Scheme != "https" || u.Host == "" {
			bad("web.console.api", "%q is not an https:// URL (leave it empty for this config's admin listener)", cn.API)
		} else if c.src.has("web.console.api") {
			checkURLHost(bad, "web.console.api", cn.API)
		}
		c.checkCAFile(bad, "web.console.api_ca", cn.APICA)
		if !cn.Token.IsSet() && !cn.localAPI {
			bad("web.console.token", "is empty: set it to one of admin.console_tokens of the deskway at web.console.api")
		}
		if cn.Token.IsSet() && slices.ContainsFunc(c.Admin.Tokens, func(t Secret) bool { return t.Value() == cn.Token.Value() }) {
			// An admin token's requests name nobody but the token.
			bad("web.console.token", "is one of admin.tokens, whose requests the audit trail cannot attribute to a console user: use one of admin.console_tokens")
		} else if cn.Token.IsSet() && cn.localAPI && !slices.ContainsFunc(c.Admin.ConsoleTokens, func(t Secret) bool { return t.Value() == cn.Token.Value() }) {
			bad("web.console.token", "is not one of admin.console_tokens, so this deskway's admin API would refuse the console: add it there, or leave web.console.token empty")
		}
	}
	if l := w.LDAP; l != nil {
		if u, err := url.Parse(l.URL); err != nil || (u.Scheme != "ldap" && u.Scheme != "ldaps") || u.Host == "" {
			bad("web.ldap.url", "%q is not ldap://HOST[:PORT] or ldaps://HOST[:PORT]", l.URL)
		} else {
			checkURLHost(bad, "web.ldap.url", l.URL)
		}
		c.checkCAFile(bad, "web.ldap.ca", l.CA)
		if l.BaseDN == "" {
			bad("web.ldap.base_dn", "is empty: where users are searched, e.g. dc=example,dc=com")
		}
		if !userFilterAttribute.MatchString(l.UserFilter) {
			// The portal checks that the entry found holds the typed name
			// in that attribute: a directory also matches look-alikes.
			bad("web.ldap.user_filter", "%q has no (ATTRIBUTE={user}) comparing an attribute with the typed name", l.UserFilter)
		}
		if !strings.Contains(l.GroupFilter, "{dn}") {
			bad("web.ldap.group_filter", "%q does not name {dn}", l.GroupFilter)
		}
	}
	if w.SessionIdle.D() <= 0 || w.SessionMax.D() < w.SessionIdle.D() {
		bad("web.session_idle", "%s must be positive and no longer than web.session_max %s", w.SessionIdle.D(), w.SessionMax.D())
	}
}

// validateAdminConsoleTokens checks that no console credential is also
// an admin token, which names nobody in the audit trail.
func (c *Config) validateAdminConsoleTokens(bad func(string, string, ...any)) {
	for i, t := range c.Admin.ConsoleTokens {
		if !t.IsSet() {
			bad(fmt.Sprintf("admin.console_tokens[%d]", i), "is empty")
		} else if slices.ContainsFunc(c.Admin.Tokens, func(a Secret) bool { return a.Value() == t.Value() }) {
			bad(fmt.Sprintf("admin.console_tokens[%d]", i), "is also in admin.tokens: a credential is a console's or an administrator's, not both")
		}
	}
}
