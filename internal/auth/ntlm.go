package auth

import (
	"crypto/hmac"
	"crypto/md5"
	"crypto/rand"
	"crypto/rc4" //nolint:staticcheck // NTLM key exchange is defined over RC4.
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/deskway/deskway/internal/proto/ntlm"
)

// ErrBadCredentials is returned for an unknown user or a wrong password;
// callers must not tell the two apart to the client.
var ErrBadCredentials = errors.New("auth: bad user name or password")

// NTLMServer verifies NTLMv2 logins against the local store. It keeps no
// per-login state itself: the caller holds an NTLMExchange per connection,
// because HTTP NTLM authenticates the TCP connection, not the request.
type NTLMServer struct {
	Users  *Users
	Domain string // NetBIOS domain name offered in the challenge
	Host   string // NetBIOS computer name offered in the challenge
	Now    func() time.Time
}

// NTLMExchange is the state of one three-leg NTLM login.
type NTLMExchange struct {
	negotiate []byte
	challenge []byte
	nonce     [8]byte
}

// Challenge answers a NEGOTIATE_MESSAGE with a CHALLENGE_MESSAGE.
func (s *NTLMServer) Challenge(negotiate []byte) (*NTLMExchange, []byte, error) {
	neg, err := ntlm.DecodeNegotiate(negotiate)
	if err != nil {
		return nil, nil, err
	}
	x := &NTLMExchange{negotiate: append([]byte(nil), negotiate...)}
	if _, err := rand.Read(x.nonce[:]); err != nil {
		return nil, nil, fmt.Errorf("auth: challenge nonce: %w", err)
	}
	// Offer what the client asked for among what NTLMv2 needs; we never
	// sign or seal afterwards, but the flags feed the client's MIC.
	flags := ntlm.FlagUnicode | ntlm.FlagRequestTarget | ntlm.FlagNTLM | ntlm.FlagAlwaysSign |
		ntlm.FlagTargetTypeDomain | ntlm.FlagExtendedSessionSecurity | ntlm.FlagTargetInfo | ntlm.FlagVersion
	flags |= neg.Flags & (ntlm.FlagSign | ntlm.FlagSeal | ntlm.FlagKeyExch | ntlm.Flag128 | ntlm.Flag56)
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	ts := make([]byte, 8)
	binary.LittleEndian.PutUint64(ts, filetime(now()))
	host := strings.ToUpper(s.Host)
	dom := strings.ToUpper(s.Domain)
	info := ntlm.AppendAvPairs(nil, []ntlm.AvPair{
		{ID: ntlm.AvNbDomainName, Value: ntlm.EncodeUTF16(dom)},
		{ID: ntlm.AvNbComputerName, Value: ntlm.EncodeUTF16(host)},
		{ID: ntlm.AvDNSDomainName, Value: ntlm.EncodeUTF16(strings.ToLower(s.Domain))},
		{ID: ntlm.AvDNSComputerName, Value: ntlm.EncodeUTF16(strings.ToLower(s.Host))},
		{ID: ntlm.AvTimestamp, Value: ts},
	})
	ch := &ntlm.Challenge{Flags: flags, TargetName: dom, ServerChallenge: x.nonce, TargetInfo: info}
	x.challenge = ch.Append(nil)
	return x, x.challenge, nil
}

// Authenticate checks the AUTHENTICATE_MESSAGE of exchange x and returns the
// user. Only NTLMv2 is accepted; NTLMv1 and anonymous logins are refused.
func (s *NTLMServer) Authenticate(x *NTLMExchange, msg []byte) (*User, error) {
	a, err := ntlm.DecodeAuthenticate(msg)
	if err != nil {
		return nil, err
	}
	if a.User == "" {
		return nil, fmt.Errorf("%w: anonymous NTLM login", ErrBadCredentials)
	}
	if len(a.NtResponse) < 16+28 {
		return nil, fmt.Errorf("%w: user %q sent an NTLMv1 or empty response; only NTLMv2 is accepted", ErrBadCredentials, a.User)
	}
	u, ok := s.Users.Lookup(a.User)
	if !ok {
		return nil, fmt.Errorf("%w: unknown user %q", ErrBadCredentials, a.User)
	}
	proof, blob := a.NtResponse[:16], a.NtResponse[16:]
	// Clients compute NTOWFv2 with the domain they typed; try it, then the
	// empty and our own domain, as Windows servers accept all three.
	var key []byte
	for _, dom := range []string{a.Domain, "", s.Domain, strings.ToUpper(s.Domain)} {
		k := ntowfv2(u.ntHash, a.User, dom)
		if hmac.Equal(hmacMD5(k, x.nonce[:], blob), proof) {
			key = k
			break
		}
	}
	if key == nil {
		return nil, fmt.Errorf("%w: wrong password for %q", ErrBadCredentials, a.User)
	}
	if err := checkMIC(x, a, key, proof, blob); err != nil {
		return nil, err
	}
	return u, nil
}

// checkMIC verifies the message integrity code when the client says it sent
// one, so the three messages cannot be spliced from different logins.
func checkMIC(x *NTLMExchange, a *ntlm.Authenticate, key, proof, blob []byte) error {
	if len(blob) < 28 {
		return nil
	}
	pairs, err := ntlm.ParseAvPairs(blob[28:])
	if err != nil {
		return fmt.Errorf("%w: target info in response: %v", ErrBadCredentials, err)
	}
	micPresent := false
	for _, p := range pairs {
		if p.ID == ntlm.AvFlags && len(p.Value) == 4 && binary.LittleEndian.Uint32(p.Value)&ntlm.AvFlagMICPresent != 0 {
			micPresent = true
		}
	}
	if !micPresent {
		return nil
	}
	if a.MICOffset == 0 {
		return fmt.Errorf("%w: MIC announced but message has no room for it", ErrBadCredentials)
	}
	sessionBase := hmacMD5(key, proof)
	exported := sessionBase
	if a.Flags&ntlm.FlagKeyExch != 0 && len(a.EncryptedKey) == 16 {
		c, err := rc4.NewCipher(sessionBase)
		if err != nil {
			return fmt.Errorf("auth: rc4: %w", err)
		}
		exported = make([]byte, 16)
		c.XORKeyStream(exported, a.EncryptedKey)
	}
	raw := append([]byte(nil), a.Raw...)
	got := append([]byte(nil), raw[a.MICOffset:a.MICOffset+16]...)
	clear(raw[a.MICOffset : a.MICOffset+16])
	want := hmacMD5(exported, x.negotiate, x.challenge, raw)
	if !hmac.Equal(got, want) {
		return fmt.Errorf("%w: MIC mismatch for %q", ErrBadCredentials, a.User)
	}
	return nil
}

func ntowfv2(ntHash [16]byte, user, domain string) []byte {
	return hmacMD5(ntHash[:], ntlm.EncodeUTF16(strings.ToUpper(user)+domain))
}

func hmacMD5(key []byte, parts ...[]byte) []byte {
	m := hmac.New(md5.New, key)
	for _, p := range parts {
		m.Write(p)
	}
	return m.Sum(nil)
}

// filetime converts t to Windows FILETIME (100 ns since 1601).
func filetime(t time.Time) uint64 {
	return uint64(t.UnixNano()/100) + 116444736000000000
}
