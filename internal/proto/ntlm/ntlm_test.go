package ntlm

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The NEGOTIATE message captured from Debian's xfreerdp 2.11.7 (flags
// 0xe20882b7, no domain or workstation, version 6.1.7601).
const xfreerdpNegotiate = "4e544c4d53535000 01000000 b78208e2 0000000000000000 0000000000000000 0601b11d0000000f"

func TestDecodeNegotiate(t *testing.T) {
	m, err := DecodeNegotiate(unhex(t, xfreerdpNegotiate))
	if err != nil {
		t.Fatal(err)
	}
	if m.Flags != 0xe20882b7 || m.Flags&FlagKeyExch == 0 || m.Flags&FlagUnicode == 0 {
		t.Fatalf("flags %08x", m.Flags)
	}
	if _, err := DecodeNegotiate(unhex(t, "4e544c4d53535000 02000000 00000000")); err == nil {
		t.Fatal("challenge accepted as negotiate")
	}
}

func TestChallengeRoundTrip(t *testing.T) {
	info := AppendAvPairs(nil, []AvPair{{ID: AvNbDomainName, Value: EncodeUTF16("DW")}, {ID: AvTimestamp, Value: make([]byte, 8)}})
	c := &Challenge{Flags: FlagUnicode | FlagNTLM | FlagTargetInfo, TargetName: "DW", ServerChallenge: [8]byte{1, 2, 3, 4, 5, 6, 7, 8}, TargetInfo: info}
	b := c.Append(nil)
	want := unhex(t, "4e544c4d53535000 02000000 0400 0400 38000000 01028000 0102030405060708 0000000000000000 1800 1800 3c000000 0601b11d0000000f 44005700")
	if !bytes.Equal(b[:len(want)], want) {
		t.Fatalf("challenge head\n got %x\nwant %x", b[:len(want)], want)
	}
	d, err := DecodeChallenge(b)
	if err != nil || d.TargetName != "DW" || !bytes.Equal(d.TargetInfo, info) || d.ServerChallenge != c.ServerChallenge {
		t.Fatalf("decode: %+v %v", d, err)
	}
	pairs, err := ParseAvPairs(d.TargetInfo)
	if err != nil || len(pairs) != 2 || DecodeUTF16(pairs[0].Value) != "DW" {
		t.Fatalf("pairs %+v %v", pairs, err)
	}
}

func TestAuthenticateRoundTrip(t *testing.T) {
	b := EncodeAuthenticate(AuthenticateFields{NtResponse: bytes.Repeat([]byte{7}, 60), Domain: "dom", User: "alice", Workstation: "pc", EncryptedKey: make([]byte, 16), Flags: FlagUnicode | FlagKeyExch})
	a, err := DecodeAuthenticate(b)
	if err != nil {
		t.Fatal(err)
	}
	if a.User != "alice" || a.Domain != "dom" || a.Workstation != "pc" || len(a.NtResponse) != 60 || a.MICOffset != 72 {
		t.Fatalf("%+v", a)
	}
}

func TestAuthenticateErrors(t *testing.T) {
	b := EncodeAuthenticate(AuthenticateFields{NtResponse: make([]byte, 60), User: "u", Flags: FlagUnicode})
	bad := append([]byte(nil), b...)
	bad[20] = 0xff // NtChallengeResponse length past the end
	if _, err := DecodeAuthenticate(bad); err == nil || !strings.Contains(err.Error(), "past message end") {
		t.Fatalf("want past-end error, got %v", err)
	}
	oem := EncodeAuthenticate(AuthenticateFields{User: "u", Flags: FlagOEM})
	if _, err := DecodeAuthenticate(oem); err == nil {
		t.Fatal("OEM strings accepted")
	}
	if _, err := DecodeAuthenticate(b[:40]); err == nil {
		t.Fatal("truncated message accepted")
	}
	if _, err := MessageType(make([]byte, MaxMessageLen+1)); err == nil {
		t.Fatal("oversized message accepted")
	}
	if _, err := ParseAvPairs([]byte{1, 0, 9, 0, 1}); err == nil {
		t.Fatal("AV pair past end accepted")
	}
}

func FuzzDecodeNegotiate(f *testing.F) {
	f.Add(unhex(f, xfreerdpNegotiate))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeNegotiate(b)
		if err != nil {
			return
		}
		if _, err := DecodeNegotiate(m.Append(nil)); err != nil {
			t.Fatalf("re-encoded negotiate does not decode: %v", err)
		}
	})
}

func FuzzDecodeChallenge(f *testing.F) {
	f.Add((&Challenge{TargetName: "X", TargetInfo: AppendAvPairs(nil, nil)}).Append(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeChallenge(b)
		if err != nil {
			return
		}
		_, _ = ParseAvPairs(c.TargetInfo)
	})
}

func FuzzDecodeAuthenticate(f *testing.F) {
	f.Add(EncodeAuthenticate(AuthenticateFields{NtResponse: make([]byte, 48), User: "alice", Flags: FlagUnicode}))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := DecodeAuthenticate(b)
		if err != nil {
			return
		}
		if a.MICOffset != 0 && a.MICOffset+16 > len(a.Raw) {
			t.Fatalf("MIC offset %d past message of %d", a.MICOffset, len(a.Raw))
		}
	})
}
