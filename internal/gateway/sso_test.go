package gateway_test

import (
	"bytes"
	"encoding/binary"
	"testing"
	"unicode/utf16"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/proto/x224"
)

// clientInfoFor is a Unicode Client Info PDU logging on as user with
// password, as the browser's client sends it.
func clientInfoFor(user, password string) []byte {
	strs := [][]byte{nil, utf16le(user), utf16le(password), nil, nil}
	info := binary.LittleEndian.AppendUint32([]byte{0x40, 0, 0, 0, 0x09, 0x04, 0, 0}, 0x133)
	for _, s := range strs {
		info = binary.LittleEndian.AppendUint16(info, uint16(len(s)))
	}
	for _, s := range strs {
		info = append(append(info, s...), 0, 0)
	}
	body := append([]byte{0x02, 0xf0, 0x80, 0x64, 0x00, 0x06, 0x03, 0xeb, 0x70, byte(len(info))}, info...)
	return append([]byte{3, 0, 0, byte(len(body) + 4)}, body...)
}

// withDesktops maps alice and bob to desktop accounts of their own.
func withDesktops(c *config.Config) {
	c.Auth.DesktopAccounts = []config.DesktopAccount{
		{User: "alice", Account: "desk-alice", Password: config.NewSecret("alice-host-pw")},
		{User: "bob", Account: "desk-bob", Password: config.NewSecret("bob-host-pw")},
	}
}

// TestBrowserSingleSignOn: the gateway logs a browser session on with
// the desktop account of the user its token names, whatever the browser
// put in its Client Info PDU; the browser held no password.
func TestBrowserSingleSignOn(t *testing.T) {
	_, host, b := withholdingSession(t, nil, x224.ProtocolSSL, withDesktops)
	b.send(t, clientInfoFor("", ""))
	if got, want := recv(t, host), autoLogon(clientInfoFor("desk-alice", "alice-host-pw")); !bytes.Equal(got, want) {
		t.Fatalf("the host got\n%x\nwant\n%x", got, want)
	}
}

// TestBrowserSingleSignOnOtherAccount is the attack: alice, holding her
// own token, names bob's desktop account in her Client Info PDU to be
// logged on as bob. The host must get alice's account and password, and
// bob's password must never leave the gateway.
func TestBrowserSingleSignOnOtherAccount(t *testing.T) {
	_, host, b := withholdingSession(t, nil, x224.ProtocolSSL, withDesktops)
	b.send(t, clientInfoFor("desk-bob", ""))
	got := recv(t, host)
	if bytes.Contains(got, utf16le("bob-host-pw")) || bytes.Contains(got, utf16le("desk-bob")) {
		t.Fatalf("alice's session was logged on as bob: the host got %x", got)
	}
	if want := autoLogon(clientInfoFor("desk-alice", "alice-host-pw")); !bytes.Equal(got, want) {
		t.Fatalf("the host got\n%x\nwant\n%x", got, want)
	}
}

// TestBrowserNoDesktopAccount: a user with no desktop account gets no
// one's credentials: the Client Info PDU passes with only auto-logon on.
func TestBrowserNoDesktopAccount(t *testing.T) {
	_, host, b := withholdingSession(t, nil, x224.ProtocolSSL, func(c *config.Config) {
		c.Auth.DesktopAccounts = []config.DesktopAccount{{User: "bob", Account: "desk-bob", Password: config.NewSecret("bob-host-pw")}}
	})
	b.send(t, clientInfoFor("desk-bob", "typed"))
	if got, want := recv(t, host), autoLogon(clientInfoFor("desk-bob", "typed")); !bytes.Equal(got, want) {
		t.Fatalf("the host got\n%x\nwant\n%x", got, want)
	}
}

// autoLogon is p with INFO_AUTOLOGON set in its TS_INFO_PACKET flags.
func autoLogon(p []byte) []byte {
	p = bytes.Clone(p)
	p[4+3+7+4+4] |= x224.InfoAutoLogon
	return p
}

func utf16le(s string) []byte {
	var e []byte
	for _, u := range utf16.Encode([]rune(s)) {
		e = binary.LittleEndian.AppendUint16(e, u)
	}
	return e
}
