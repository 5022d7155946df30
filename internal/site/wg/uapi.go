package wg

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// The device is configured through wireguard-go's in-process UAPI
// (Device.IpcSet), the text protocol `wg` speaks over a socket; no socket
// is opened, so nothing else on the machine can reconfigure the device.
// Reference: https://www.wireguard.com/xplatform/#configuration-protocol

// uapiFull is the whole configuration of a new device.
func uapiFull(c Config, key PrivateKey) string {
	var b strings.Builder
	fmt.Fprintf(&b, "private_key=%s\nlisten_port=%d\nreplace_peers=true\n", key.hex(), c.ListenPort)
	for _, s := range c.Sites {
		writePeer(&b, s)
	}
	return b.String()
}

// uapiChange moves a running device from old to next. Peers present in
// both keep their sessions (no new handshake, no lost packet); peers gone
// from next are removed, so a revoked office is cut off at once.
func uapiChange(old, next Config, oldKey, nextKey PrivateKey) string {
	var b strings.Builder
	if oldKey != nextKey {
		fmt.Fprintf(&b, "private_key=%s\n", nextKey.hex())
	}
	if old.ListenPort != next.ListenPort {
		fmt.Fprintf(&b, "listen_port=%d\n", next.ListenPort)
	}
	keep := map[PublicKey]bool{}
	for _, s := range next.Sites {
		keep[s.PublicKey] = true
	}
	for _, s := range old.Sites {
		if !keep[s.PublicKey] {
			fmt.Fprintf(&b, "public_key=%s\nremove=true\n", s.PublicKey.hex())
		}
	}
	for _, s := range next.Sites {
		writePeer(&b, s)
	}
	return b.String()
}

// writePeer sets one peer completely: its allowed IPs replace what it
// had, and a site without an endpoint or keepalive has them cleared.
func writePeer(b *strings.Builder, s Site) {
	fmt.Fprintf(b, "public_key=%s\nreplace_allowed_ips=true\n", s.PublicKey.hex())
	if s.Endpoint.IsValid() {
		fmt.Fprintf(b, "endpoint=%s\n", s.Endpoint)
	}
	fmt.Fprintf(b, "persistent_keepalive_interval=%d\n", s.PersistentKeepalive.seconds())
	for _, p := range s.Prefixes {
		fmt.Fprintf(b, "allowed_ip=%s\n", p)
	}
}

// peerStats is what the device counts for one peer.
type peerStats struct {
	lastHandshake time.Time // zero before the first handshake
	rxBytes       uint64
	txBytes       uint64
	allowed       []netip.Prefix
}

// parseStats reads the peers' counters from the device's UAPI get
// output. The output also holds the private key: it is skipped, never
// kept or logged.
func parseStats(text string) (map[PublicKey]peerStats, error) {
	out := map[PublicKey]peerStats{}
	var cur *PublicKey
	var st peerStats
	var sec, nsec int64
	flush := func() {
		if cur != nil {
			if sec != 0 || nsec != 0 {
				st.lastHandshake = time.Unix(sec, nsec)
			}
			out[*cur] = st
		}
	}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok {
			continue
		}
		var err error
		switch k {
		case "public_key":
			flush()
			var pk PublicKey
			var n int
			if n, err = hex.Decode(pk[:], []byte(v)); err == nil && n != keyLen {
				err = fmt.Errorf("%d bytes", n)
			}
			cur, st, sec, nsec = &pk, peerStats{}, 0, 0
		case "last_handshake_time_sec":
			sec, err = strconv.ParseInt(v, 10, 64)
		case "last_handshake_time_nsec":
			nsec, err = strconv.ParseInt(v, 10, 64)
		case "rx_bytes":
			st.rxBytes, err = strconv.ParseUint(v, 10, 64)
		case "tx_bytes":
			st.txBytes, err = strconv.ParseUint(v, 10, 64)
		case "allowed_ip":
			var p netip.Prefix
			if p, err = netip.ParsePrefix(v); err == nil {
				st.allowed = append(st.allowed, p)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("wg: device stats: %s: %w", k, err)
		}
	}
	flush()
	return out, nil
}
