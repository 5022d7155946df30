package auth

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/Azure/go-ntlmssp"
	"github.com/golang-jwt/jwt/v5"

	"github.com/deskway/deskway/internal/config"
)

func testUsers(t *testing.T) *Users {
	t.Helper()
	u, err := NewUsers([]config.User{
		{Name: "alice", Password: config.NewSecret("Secret123!"), Groups: []string{"staff"}},
		{Name: "bob", NTHash: config.NewSecret(hex.EncodeToString(func() []byte { h := NTHash("pw"); return h[:] }()))},
	})
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestNTHashVector(t *testing.T) {
	// MS-NLMP 4.2.1: NTOWFv1("Password") = a4f49c406510bdcab6824ee7c30fd852.
	h := NTHash("Password")
	if got := hex.EncodeToString(h[:]); got != "a4f49c406510bdcab6824ee7c30fd852" {
		t.Fatalf("NTHash = %s", got)
	}
}

// login runs a full exchange with an independent NTLM client implementation.
func login(t *testing.T, s *NTLMServer, user, pass string) (*User, error) {
	t.Helper()
	neg, err := ntlmssp.NewNegotiateMessage("", "")
	if err != nil {
		t.Fatal(err)
	}
	x, ch, err := s.Challenge(neg)
	if err != nil {
		t.Fatalf("Challenge: %v", err)
	}
	am, err := ntlmssp.ProcessChallenge(ch, user, pass, false)
	if err != nil {
		t.Fatalf("client ProcessChallenge: %v", err)
	}
	return s.Authenticate(x, am)
}

func TestNTLMServer(t *testing.T) {
	s := &NTLMServer{Users: testUsers(t), Domain: "DESKWAY", Host: "gw1"}
	u, err := login(t, s, "alice", "Secret123!")
	if err != nil || u.Name != "alice" {
		t.Fatalf("good login: %v %v", u, err)
	}
	if u, err := login(t, s, `DESKWAY\ALICE`, "Secret123!"); err != nil || u.Name != "alice" {
		t.Fatalf("domain-qualified upper-case login: %v %v", u, err)
	}
	if u, err := login(t, s, "bob", "pw"); err != nil || u.Name != "bob" {
		t.Fatalf("nt_hash user: %v %v", u, err)
	}
	for _, c := range [][2]string{{"alice", "wrong"}, {"mallory", "Secret123!"}} {
		if _, err := login(t, s, c[0], c[1]); !errors.Is(err, ErrBadCredentials) {
			t.Fatalf("%s/%s accepted or wrong error: %v", c[0], c[1], err)
		}
	}
}

func TestNTLMReplayedAcrossChallenges(t *testing.T) {
	s := &NTLMServer{Users: testUsers(t), Domain: "DESKWAY", Host: "gw1"}
	neg, _ := ntlmssp.NewNegotiateMessage("", "")
	_, ch1, _ := s.Challenge(neg)
	x2, _, _ := s.Challenge(neg)
	am, _ := ntlmssp.ProcessChallenge(ch1, "alice", "Secret123!", false)
	if _, err := s.Authenticate(x2, am); err == nil {
		t.Fatal("response to one challenge accepted for another")
	}
}

func TestNTLMGarbage(t *testing.T) {
	s := &NTLMServer{Users: testUsers(t), Domain: "D", Host: "h"}
	if _, _, err := s.Challenge([]byte("not ntlm")); err == nil {
		t.Fatal("garbage negotiate accepted")
	}
	neg, _ := ntlmssp.NewNegotiateMessage("", "")
	x, _, _ := s.Challenge(neg)
	bad := append([]byte("NTLMSSP\x00\x03\x00\x00\x00"), make([]byte, 60)...)
	bad[20] = 0xff // NtChallengeResponse length points past the end
	bad[24] = 0x10
	if _, err := s.Authenticate(x, bad); err == nil {
		t.Fatal("malformed authenticate accepted")
	}
}

func TestTokens(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }
	tk, err := NewTokens([]byte(strings.Repeat("k", 32)), clock)
	if err != nil {
		t.Fatal(err)
	}
	s, err := tk.Mint("alice", []string{"staff"}, "Host1", 3389, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	c, err := tk.Verify(s)
	if err != nil || c.User() != "alice" || c.Host != "host1" || c.Port != 3389 || c.Groups[0] != "staff" {
		t.Fatalf("verify: %+v %v", c, err)
	}
	other, _ := NewTokens([]byte(strings.Repeat("x", 32)), clock)
	if _, err := other.Verify(s); !errors.Is(err, ErrBadToken) {
		t.Fatalf("token verified with another key: %v", err)
	}
	now = now.Add(2 * time.Minute)
	if _, err := tk.Verify(s); !errors.Is(err, ErrBadToken) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("expired token: %v", err)
	}
	if _, err := tk.Verify(s); !errors.Is(err, ErrTokenExpired) {
		t.Fatalf("expired token not reported as expired: %v", err)
	}
	// VerifyExpired takes the genuine expired token, and nothing else.
	if c, err := tk.VerifyExpired(s); err != nil || c.User() != "alice" || c.Host != "host1" || c.Port != 3389 {
		t.Fatalf("verify expired: %+v %v", c, err)
	}
	if _, err := other.VerifyExpired(s); !errors.Is(err, ErrBadToken) {
		t.Fatalf("expired token verified with another key: %v", err)
	}
	if _, err := tk.VerifyExpired(s[:len(s)-2] + "xx"); err == nil {
		t.Fatal("tampered expired token accepted")
	}
	wrongAud, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, Claims{Host: "h", Port: 1, RegisteredClaims: jwt.RegisteredClaims{
		Subject: "alice", Audience: jwt.ClaimStrings{"other"}, ExpiresAt: jwt.NewNumericDate(now.Add(-time.Minute))}}).SignedString([]byte(strings.Repeat("k", 32)))
	if _, err := tk.VerifyExpired(wrongAud); !errors.Is(err, ErrBadToken) {
		t.Fatalf("expired token of another audience accepted: %v", err)
	}
	if _, err := tk.Verify(s[:len(s)-2] + "xx"); err == nil {
		t.Fatal("tampered token accepted")
	}
	if _, err := NewTokens([]byte("short"), nil); err == nil {
		t.Fatal("short key accepted")
	}
}

func TestThrottle(t *testing.T) {
	now := time.Unix(0, 0)
	th := NewThrottle(3, 10, time.Minute, func() time.Time { return now })
	office, home, attacker := netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("10.0.0.6"), netip.MustParseAddr("192.0.2.9")
	th.Succeed("alice", office) // alice works from the office
	for i := 0; i < 3; i++ {
		if lk := th.Check("alice", attacker); lk != nil {
			t.Fatalf("refused after %d failures: %v", i, lk)
		}
		th.Fail("ALICE", attacker)
	}
	if th.Check("alice", attacker) == nil || th.Check("alice", home) == nil {
		t.Fatal("alice not locked for addresses she never logged in from")
	}
	if lk := th.Check("alice", office); lk != nil {
		t.Fatalf("failures elsewhere locked alice out of her office: %v", lk)
	}
	if lk := th.Check("bob", attacker); lk != nil {
		t.Fatalf("another user refused at the attacker's address after 3 failures: %v", lk)
	}
	// A success clears the user's failures at that address: two before
	// it and two after are not three in a row.
	for range 2 {
		th.Fail("bob", office)
	}
	th.Succeed("bob", office)
	for range 2 {
		th.Fail("bob", office)
	}
	if lk := th.Check("bob", office); lk != nil {
		t.Fatalf("failures before a success still count: %v", lk)
	}
	// A spray: one failure each for many users locks the address.
	for i := range 10 {
		th.Fail(fmt.Sprint("user", i), home)
	}
	if th.Check("carol", home) == nil || th.Check("", home) == nil {
		t.Fatal("a spray of 10 users did not lock the address")
	}
	// A user named like an address is a user, not that address.
	for range 3 {
		th.Fail("10.0.0.5", attacker)
	}
	if lk := th.Check("dave", office); lk != nil {
		t.Fatalf("failures of a user named 10.0.0.5 locked that address: %v", lk)
	}
	now = now.Add(2 * time.Minute)
	if th.Check("alice", attacker) != nil || th.Check("carol", home) != nil {
		t.Fatal("still refused after the window")
	}
	th.maxKeys = 10
	for i := 0; i < 100; i++ {
		th.Fail(fmt.Sprint("u", i), netip.AddrFrom4([4]byte{10, 1, byte(i), 1}))
	}
	if len(th.addr) > 10 || len(th.pair) > 10 || len(th.unfamiliar) > 10 {
		t.Fatalf("throttle grew to %d, %d, %d keys", len(th.addr), len(th.pair), len(th.unfamiliar))
	}
}

// TestRenewAgent: the key's holder renews an agent credential, expired or
// not, with its host, group, zone and registration; nothing else renews.
func TestRenewAgent(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	past, err := NewTokens(key, func() time.Time { return time.Now().Add(-8 * 24 * time.Hour) })
	if err != nil {
		t.Fatal(err)
	}
	now, _ := NewTokens(key, nil)
	old, _ := past.MintAgent("h1", "desk", "eu", "reg-1", 7*24*time.Hour)
	if _, err := now.VerifyAgent(old); err == nil {
		t.Fatal("an expired credential verified")
	}
	fresh, err := now.RenewAgent(old, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c, err := now.VerifyAgent(fresh)
	if err != nil || c.Subject != "h1" || c.Group != "desk" || c.Zone != "eu" || c.Registration != "reg-1" {
		t.Fatalf("renewed: %+v %v", c, err)
	}
	join, _ := now.MintJoin("desk", "", time.Hour, 1)
	other, _ := NewTokens([]byte("another key, 32 bytes long......"), nil)
	forged, _ := other.MintAgent("h1", "desk", "", "reg-1", time.Hour)
	for name, tok := range map[string]string{"join token": join, "another key's credential": forged, "garbage": "x.y.z"} {
		if _, err := now.RenewAgent(tok, time.Hour); err == nil {
			t.Errorf("%s renewed", name)
		}
	}
}
