package config

import (
	"net"
	"net/url"
	"time"
)

// Web is the user portal: sign-in, the desktops a user may launch, and
// .rdp files for them, served over HTTPS by the binary itself.
type Web struct {
	Listen string `yaml:"listen"`
	// Title names the portal on its pages.
	Title string `yaml:"title"`
	// Broker is the broker's URL the portal calls as a front end; empty
	// means this config's broker.
	Broker string `yaml:"broker"`
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
}

func (c *Config) webDefaults(w *Web) {
	setDefault(&w.Listen, ":8446")
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
			}
		}
		if !w.FrontendToken.IsSet() && len(b.FrontendTokens) > 0 {
			w.FrontendToken = b.FrontendTokens[0]
		}
	}
}

func validateWeb(w *Web, bad func(string, string, ...any)) {
	if _, _, err := net.SplitHostPort(w.Listen); err != nil {
		bad("web.listen", "%q is not host:port", w.Listen)
	}
	if u, err := url.Parse(w.Broker); err != nil || u.Scheme != "https" || u.Host == "" {
		bad("web.broker", "%q is not an https:// URL (leave it empty to use this config's broker)", w.Broker)
	}
	if !w.FrontendToken.IsSet() {
		bad("web.frontend_token", "is empty: set it, or add broker.frontend_tokens to this config")
	}
	if w.CookieKey.IsSet() && len(w.CookieKey.Value()) < 32 {
		bad("web.cookie_key", "is %d bytes; use at least 32 random bytes", len(w.CookieKey.Value()))
	}
	if w.SessionIdle.D() <= 0 || w.SessionMax.D() < w.SessionIdle.D() {
		bad("web.session_idle", "%s must be positive and no longer than web.session_max %s", w.SessionIdle.D(), w.SessionMax.D())
	}
}
