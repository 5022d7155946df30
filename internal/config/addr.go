package config

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// checkListen checks an address a listener opens: host:port, where the
// host may be empty (every address) and port 0 picks a free port.
func checkListen(bad badFunc, key, v string) {
	if p := hostPortProblem(v, true); p != "" {
		bad(key, "%s", p)
	}
}

// checkDial checks an address deskway connects to: host:port with both.
func checkDial(bad badFunc, key, v string) {
	if p := hostPortProblem(v, false); p != "" {
		bad(key, "%s", p)
	}
}

// checkHostOptionalPort checks a name clients are given, host or
// host:port.
func checkHostOptionalPort(bad badFunc, key, v string) {
	if v == "" {
		return
	}
	if _, _, err := net.SplitHostPort(v); err == nil {
		checkDial(bad, key, v)
		return
	}
	if p := hostProblem(v); p != "" {
		bad(key, "%s", p)
	}
}

// checkURLHost checks the host and port of a URL already known to parse.
func checkURLHost(bad badFunc, key, raw string) {
	u, err := url.Parse(raw)
	if err != nil {
		return
	}
	if p := hostProblem(u.Hostname()); p != "" {
		bad(key, "%q: %s", raw, p)
	}
	if port := u.Port(); port != "" {
		if p := portProblem(port, false); p != "" {
			bad(key, "%q: %s", raw, p)
		}
	}
}

func hostPortProblem(v string, listen bool) string {
	host, port, err := net.SplitHostPort(v)
	if err != nil || (!listen && host == "") {
		return fmt.Sprintf("%q is not host:port", v)
	}
	if p := portProblem(port, listen); p != "" {
		return fmt.Sprintf("%q: %s", v, p)
	}
	if host == "" {
		return ""
	}
	if p := hostProblem(host); p != "" {
		return fmt.Sprintf("%q: %s", v, p)
	}
	return ""
}

// portProblem says what is wrong with a port, "" when nothing: a number
// up to 65535 (0 only for a listener), or a service name the system knows.
func portProblem(port string, listen bool) string {
	lowest := 1
	if listen {
		lowest = 0
	}
	if port == "" {
		return "the port is missing"
	}
	if strings.Trim(port, "0123456789") == "" {
		if n, err := strconv.Atoi(port); err != nil || n < lowest || n > 65535 {
			return fmt.Sprintf("port %s is out of range (%d to 65535)", port, lowest)
		}
		return ""
	}
	if _, err := net.LookupPort("tcp", port); err != nil {
		return fmt.Sprintf("%s is not a port number", port)
	}
	return ""
}

// hostProblem says what is wrong with a host, "" when nothing. A host
// whose last part is a number is meant as an IPv4 address (no DNS name
// ends in one), so 10.20.0.300 is a mistake rather than a name to look up.
func hostProblem(host string) string {
	h := strings.TrimSuffix(host, ".")
	if strings.Contains(h, ":") {
		if _, err := netip.ParseAddr(h); err != nil {
			return fmt.Sprintf("%q is not an IPv6 address", host)
		}
		return ""
	}
	labels := strings.Split(h, ".")
	if last := labels[len(labels)-1]; last != "" && strings.Trim(last, "0123456789") == "" {
		if a, err := netip.ParseAddr(h); err != nil || !a.Is4() {
			return fmt.Sprintf("%q is not an IPv4 address (four numbers from 0 to 255), and a host name cannot end in a number", host)
		}
		return ""
	}
	for _, l := range labels {
		if l == "" || len(l) > 63 || strings.Trim(l, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") != "" {
			return fmt.Sprintf("%q is not a host name (letters, digits and hyphens, with dots between)", host)
		}
	}
	return ""
}

// checkPolicyHost checks a resource policy's host: an address, a CIDR
// prefix, or a DNS name, which is anything that does not look like
// either (names are matched as the client wrote them).
func checkPolicyHost(bad badFunc, key, h string) {
	if strings.Contains(h, "/") {
		if _, err := parseCIDR(h); err != nil {
			bad(key, "%v", err)
		}
		return
	}
	if _, err := netip.ParseAddr(h); err == nil {
		return
	}
	labels := strings.Split(strings.TrimSuffix(h, "."), ".")
	if last := labels[len(labels)-1]; strings.Contains(h, ":") || (last != "" && strings.Trim(last, "0123456789") == "") {
		bad(key, "%s", hostProblem(h))
	}
}

// checkPrefixes checks a list of addresses and CIDR prefixes entry by entry.
func checkPrefixes(bad badFunc, key string, list []string) {
	for i, s := range list {
		if _, err := parsePrefix(s); err != nil {
			bad(fmt.Sprintf("%s[%d]", key, i), "%v", err)
		}
	}
}

// checkBalancers checks a proxy_protocol_from list. A prefix of every
// address is refused: whoever is trusted to send a PROXY header names
// the client, so with it any client could choose the address its
// failed logins and caps are counted against.
func checkBalancers(bad badFunc, key string, list []string) {
	checkPrefixes(bad, key, list)
	for i, s := range list {
		if p, err := parsePrefix(s); err == nil && p.Bits() == 0 {
			bad(fmt.Sprintf("%s[%d]", key, i), "%q is every address: any client could then send a PROXY header naming any address, and its failed logins and caps would count against that one; list the load balancers' addresses or their network", s)
		}
	}
}

// parsePrefix reads an address or a CIDR prefix; an address is a prefix
// of its full length, and an IPv4-mapped prefix is compared unmapped, as
// connections' addresses are.
func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		return parseCIDR(s)
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not an IP address or a CIDR prefix (like 10.0.0.0/8)", s)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// parseCIDR reads ADDRESS/BITS and says which half is wrong.
func parseCIDR(s string) (netip.Prefix, error) {
	addr, bits, _ := strings.Cut(s, "/")
	a, err := netip.ParseAddr(addr)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR prefix: %s is not an IP address", s, addr)
	}
	n, err := strconv.Atoi(bits)
	if err != nil || n < 0 || n > a.BitLen() || strings.Trim(bits, "0123456789") != "" {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR prefix: the length after / must be 0 to %d", s, a.BitLen())
	}
	p := netip.PrefixFrom(a, n)
	if a.Is4In6() && n >= 96 {
		p = netip.PrefixFrom(a.Unmap(), n-96)
	}
	return p.Masked(), nil
}

// ParsePrefixes reads addresses and CIDR prefixes; an address is a prefix
// of its full length.
func ParsePrefixes(list []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(list))
	for _, s := range list {
		p, err := parsePrefix(s)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}
