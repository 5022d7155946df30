package auth

import (
	"crypto/hmac"
	"crypto/md5"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/Azure/go-ntlmssp"

	"github.com/deskway/deskway/internal/proto/ntlm"
)

// micLogin runs a login as a client that sends a MIC does (xfreerdp,
// Windows), written here from MS-NLMP 3.3.2 and 3.1.5.1.2 apart from the
// server's code; tamper may change the AUTHENTICATE message after its MIC
// is computed.
func micLogin(t *testing.T, s *NTLMServer, user, dom, pass string, tamper func(msg []byte)) error {
	t.Helper()
	mac := func(key []byte, parts ...[]byte) []byte {
		m := hmac.New(md5.New, key)
		for _, p := range parts {
			m.Write(p)
		}
		return m.Sum(nil)
	}
	neg, err := ntlmssp.NewNegotiateMessage("", "")
	if err != nil {
		t.Fatal(err)
	}
	x, chBytes, err := s.Challenge(neg)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := ntlm.DecodeChallenge(chBytes)
	if err != nil {
		t.Fatal(err)
	}
	pairs, err := ntlm.ParseAvPairs(ch.TargetInfo)
	if err != nil {
		t.Fatal(err)
	}
	var ts []byte
	for _, p := range pairs {
		if p.ID == ntlm.AvTimestamp {
			ts = p.Value
		}
	}
	flags := binary.LittleEndian.AppendUint32(nil, ntlm.AvFlagMICPresent)
	info := ntlm.AppendAvPairs(nil, append(pairs, ntlm.AvPair{ID: ntlm.AvFlags, Value: flags}))
	h := NTHash(pass)
	key := mac(h[:], ntlm.EncodeUTF16(strings.ToUpper(user)+dom))
	temp := append([]byte{1, 1, 0, 0, 0, 0, 0, 0}, ts...)
	temp = append(temp, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0) // client challenge, reserved
	temp = append(append(temp, info...), 0, 0, 0, 0)
	proof := mac(key, ch.ServerChallenge[:], temp)
	msg := ntlm.EncodeAuthenticate(ntlm.AuthenticateFields{LmResponse: make([]byte, 24), NtResponse: append(proof, temp...),
		Domain: dom, User: user, Workstation: "PC", Flags: ch.Flags})
	// No key exchange: the exported session key is the session base key.
	copy(msg[72:88], mac(mac(key, proof), neg, chBytes, msg))
	if tamper != nil {
		tamper(msg)
	}
	_, err = s.Authenticate(x, msg)
	return err
}

// TestNTLMMIC: a login whose MIC is right is accepted (so the client
// above computes it as real clients do); one with a flipped MIC bit, a
// zeroed MIC, or a message changed after the MIC was computed is refused
// as a MIC mismatch, which is what keeps a relay from splicing messages.
func TestNTLMMIC(t *testing.T) {
	s := &NTLMServer{Users: testUsers(t), Domain: "DESKWAY", Host: "gw1"}
	if err := micLogin(t, s, "alice", "DESKWAY", "Secret123!", nil); err != nil {
		t.Fatalf("login with a correct MIC: %v", err)
	}
	for name, tamper := range map[string]func([]byte){
		"flipped bit": func(m []byte) { m[80] ^= 0x01 },
		"zeroed":      func(m []byte) { clear(m[72:88]) },
		// The workstation name is the last field before the session key:
		// changed after signing, the MIC no longer covers the message.
		"message changed": func(m []byte) { m[len(m)-1] ^= 0x20 },
	} {
		err := micLogin(t, s, "alice", "DESKWAY", "Secret123!", tamper)
		if !errors.Is(err, ErrBadCredentials) || !strings.Contains(err.Error(), "MIC mismatch") {
			t.Errorf("%s MIC: %v, want a MIC mismatch", name, err)
		}
	}
}
