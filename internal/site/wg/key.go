package wg

import (
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strings"

	"golang.org/x/crypto/curve25519"
)

// keyLen is the size of a Curve25519 key, private or public.
const keyLen = 32

// PublicKey is a site's WireGuard public key, written in base64 as
// `wg pubkey` prints it.
type PublicKey [keyLen]byte

// PrivateKey is the gateway's WireGuard private key for one tenant. It
// never prints: String and LogValue show REDACTED.
type PrivateKey [keyLen]byte

// ParsePublicKey reads a base64 public key.
func ParsePublicKey(s string) (PublicKey, error) {
	b, err := parseKey(s)
	return PublicKey(b), err
}

// ParsePrivateKey reads a base64 private key as `wg genkey` writes it;
// surrounding white space (the file's newline) is ignored.
func ParsePrivateKey(s string) (PrivateKey, error) {
	b, err := parseKey(strings.TrimSpace(s))
	if err != nil {
		// The text may be a key with a typo: never echo it.
		return PrivateKey{}, fmt.Errorf("not a WireGuard private key (write one with wg genkey)")
	}
	return PrivateKey(b), nil
}

func parseKey(s string) ([keyLen]byte, error) {
	var k [keyLen]byte
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b) != keyLen {
		return k, fmt.Errorf("%q is not a WireGuard key (44 characters of base64, as wg genkey and wg pubkey write)", s)
	}
	copy(k[:], b)
	return k, nil
}

// String returns the key in base64.
func (k PublicKey) String() string { return base64.StdEncoding.EncodeToString(k[:]) }

// IsZero reports whether the key was never set.
func (k PublicKey) IsZero() bool { return k == PublicKey{} }

// MarshalText implements encoding.TextMarshaler.
func (k PublicKey) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler (YAML scalars).
func (k *PublicKey) UnmarshalText(b []byte) error {
	v, err := ParsePublicKey(string(b))
	if err != nil {
		return err
	}
	*k = v
	return nil
}

// hex is the key as the UAPI protocol writes it.
func (k PublicKey) hex() string { return hex.EncodeToString(k[:]) }

// Public derives the public key that sites configure for this gateway.
func (k PrivateKey) Public() (PublicKey, error) {
	b, err := curve25519.X25519(k[:], curve25519.Basepoint)
	if err != nil {
		return PublicKey{}, fmt.Errorf("wg: derive public key: %w", err)
	}
	return PublicKey(b), nil
}

// IsZero reports whether the key was never set.
func (k PrivateKey) IsZero() bool { return k == PrivateKey{} }

// String hides the key.
func (k PrivateKey) String() string { return "REDACTED" }

// LogValue implements slog.LogValuer.
func (k PrivateKey) LogValue() slog.Value { return slog.StringValue("REDACTED") }

func (k PrivateKey) hex() string { return hex.EncodeToString(k[:]) }
