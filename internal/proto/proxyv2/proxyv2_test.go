package proxyv2

import (
	"encoding/hex"
	"net/netip"
	"testing"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

const sig = "0d0a0d0a000d0a515549540a"

// TestParse: headers as HAProxy 2.6 sends them with send-proxy-v2 (a
// client 192.0.2.10:51000 that reached 198.51.100.1:443; the same over
// IPv6; a TLV after the addresses) and with check-send-proxy for a
// health check (LOCAL, no addresses).
func TestParse(t *testing.T) {
	for name, c := range map[string]struct {
		hex          string
		local        bool
		source, dest string
	}{
		"ipv4":      {sig + "21" + "11" + "000c" + "c000020a" + "c6336401" + "c738" + "01bb", false, "192.0.2.10:51000", "198.51.100.1:443"},
		"ipv6":      {sig + "21" + "21" + "0024" + "20010db8000000000000000000000001" + "20010db8000000000000000000000002" + "c738" + "01bb", false, "[2001:db8::1]:51000", "[2001:db8::2]:443"},
		"with TLV":  {sig + "21" + "11" + "0010" + "c000020a" + "c6336401" + "c738" + "01bb" + "040001" + "00", false, "192.0.2.10:51000", "198.51.100.1:443"},
		"local":     {sig + "20" + "00" + "0000", true, "", ""},
		"v4-mapped": {sig + "21" + "21" + "0024" + "00000000000000000000ffffc000020a" + "00000000000000000000ffffc6336401" + "c738" + "01bb", false, "192.0.2.10:51000", "198.51.100.1:443"},
	} {
		h, err := Parse(unhex(t, c.hex))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if h.Local != c.local || (c.source != "" && (h.Source != netip.MustParseAddrPort(c.source) || h.Dest != netip.MustParseAddrPort(c.dest))) {
			t.Fatalf("%s: got %+v", name, h)
		}
	}
}

// TestRefuses: what is not a version 2 PROXY header for a TCP
// connection is an error: a TLS ClientHello, version 1 text, another
// version or command, a length past MaxLen or not matching, UDP, and
// addresses cut short.
func TestRefuses(t *testing.T) {
	for name, h := range map[string]string{
		"TLS":        "16030100c4010000c00303" + "0000000000",
		"v1 text":    hex.EncodeToString([]byte("PROXY TCP4 192.0.2.10 19")),
		"version 1":  sig + "11" + "11" + "000c" + "000000000000000000000000",
		"command 2":  sig + "22" + "11" + "000c" + "000000000000000000000000",
		"too long":   sig + "21" + "11" + "0401",
		"length":     sig + "21" + "11" + "000d" + "000000000000000000000000",
		"UDP":        sig + "21" + "12" + "000c" + "000000000000000000000000",
		"short IPv4": sig + "21" + "11" + "0008" + "0000000000000000",
	} {
		if hd, err := Parse(unhex(t, h)); err == nil {
			t.Errorf("%s: accepted as %+v", name, hd)
		}
	}
}

// FuzzParse: a header Parse accepts is as long as Len says, and a
// non-local one carries valid addresses.
func FuzzParse(f *testing.F) {
	f.Add(unhex(f, sig+"21"+"11"+"000c"+"c000020a"+"c6336401"+"c738"+"01bb"))
	f.Add(unhex(f, sig+"20"+"00"+"0000"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := Parse(b)
		if err != nil {
			return
		}
		n, err := Len(b)
		if err != nil || len(b) != FixedLen+n {
			t.Fatalf("accepted %d bytes, Len says %d (%v)", len(b), n, err)
		}
		if !h.Local && (!h.Source.IsValid() || !h.Dest.IsValid()) {
			t.Fatalf("a proxied connection without addresses: %+v", h)
		}
	})
}
