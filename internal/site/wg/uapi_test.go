package wg

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

// hex of testPub1 and testPub2, as the UAPI protocol writes keys.
const (
	hexPub1 = "14ff613fdf4f89ab83eda7b92a1235e9656237a1c511c0a57cbbb91e45bb0e08"
	hexPub2 = "9ef29bdb6385c07de5b6429474d6937af6c8700e0c0a6bc36ce1a5bac5797a27"
)

func TestUAPIFull(t *testing.T) {
	c := decode(t, goodYAML)
	key, err := ParsePrivateKey("8GzH7fYx3NCmsz5v4y0nDkz+oRVBz2mPZ0v7cJbVwUs=")
	if err != nil {
		t.Fatal(err)
	}
	want := `private_key=f06cc7edf631dcd0a6b33e6fe32d270e4cfea11541cf698f674bfb7096d5c14b
listen_port=51820
replace_peers=true
public_key=` + hexPub1 + `
replace_allowed_ips=true
endpoint=198.51.100.7:51820
persistent_keepalive_interval=25
allowed_ip=192.168.1.0/24
allowed_ip=2001:db8:1::/48
public_key=` + hexPub2 + `
replace_allowed_ips=true
persistent_keepalive_interval=0
allowed_ip=192.168.2.0/24
`
	if got := uapiFull(c, key); got != want {
		t.Errorf("uapiFull:\n%s\nwant:\n%s", got, want)
	}
}

func TestUAPIChangeRemovesGoneSites(t *testing.T) {
	old := decode(t, goodYAML)
	next := decode(t, goodYAML)
	next.Sites = next.Sites[1:] // paris revoked
	next.Sites[0].Prefixes = append(next.Sites[0].Prefixes, netip.MustParsePrefix("192.168.3.0/24"))
	var key PrivateKey
	key[0] = 1
	got := uapiChange(old, next, key, key)
	want := `public_key=` + hexPub1 + `
remove=true
public_key=` + hexPub2 + `
replace_allowed_ips=true
persistent_keepalive_interval=0
allowed_ip=192.168.2.0/24
allowed_ip=192.168.3.0/24
`
	if got != want {
		t.Errorf("uapiChange:\n%s\nwant:\n%s", got, want)
	}
	if strings.Contains(got, "private_key") || strings.Contains(got, "replace_peers") || strings.Contains(got, "listen_port") {
		t.Errorf("an unchanged key or port is set again, or all peers replaced (dropping live sessions):\n%s", got)
	}
}

func TestParseStats(t *testing.T) {
	text := `private_key=f06cc7edf631dcd0a6b33e6fe32d270e4cfea11541cf698f674bfb7096d5c14b
listen_port=51820
public_key=` + hexPub1 + `
preshared_key=0000000000000000000000000000000000000000000000000000000000000000
protocol_version=1
endpoint=198.51.100.7:51820
last_handshake_time_sec=1790000000
last_handshake_time_nsec=5
tx_bytes=1184
rx_bytes=92
persistent_keepalive_interval=25
allowed_ip=192.168.1.0/24
public_key=` + hexPub2 + `
preshared_key=0000000000000000000000000000000000000000000000000000000000000000
protocol_version=1
last_handshake_time_sec=0
last_handshake_time_nsec=0
tx_bytes=148
rx_bytes=0
persistent_keepalive_interval=0
allowed_ip=192.168.2.0/24
`
	st, err := parseStats(text)
	if err != nil {
		t.Fatal(err)
	}
	p1, _ := ParsePublicKey(testPub1)
	p2, _ := ParsePublicKey(testPub2)
	if got := st[p1]; !got.lastHandshake.Equal(time.Unix(1790000000, 5)) || got.txBytes != 1184 || got.rxBytes != 92 {
		t.Errorf("paris: %+v", got)
	}
	if got := st[p2]; !got.lastHandshake.IsZero() || got.txBytes != 148 || got.rxBytes != 0 {
		t.Errorf("lyon (no handshake yet): %+v", got)
	}
	if _, err := parseStats("public_key=" + hexPub1 + "\nrx_bytes=-1\n"); err == nil {
		t.Error("a negative counter was accepted")
	}
}
