package tsgu

import (
	"bytes"
	"reflect"
	"testing"
)

func addSeeds(f *testing.F) {
	for _, v := range vectors {
		b, err := v.msg.Append(nil)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
}

// roundTrip checks decode → encode → decode is stable for anything that decodes.
func roundTrip(t *testing.T, m Message) {
	enc, err := m.Append(nil)
	if err != nil {
		// Decoded values can exceed encoder limits only through strings whose
		// NUL was stripped; that is still bounded by MaxPacketLen.
		t.Fatalf("re-encode %s: %v", m.Type(), err)
	}
	m2, err := Decode(enc)
	if err != nil {
		t.Fatalf("decode of re-encoded %s: %v (%x)", m.Type(), err, enc)
	}
	enc2, err := m2.Append(nil)
	if err != nil || !bytes.Equal(enc, enc2) {
		t.Fatalf("unstable encoding for %s", m.Type())
	}
	if !reflect.DeepEqual(m, m2) && m.Type() != TypeKeepalive {
		t.Fatalf("round trip changed %s:\n%#v\n%#v", m.Type(), m, m2)
	}
}

// FuzzDecode feeds whole frames to the top-level decoder.
func FuzzDecode(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b)
		if err != nil {
			return
		}
		roundTrip(t, m)
	})
}

// FuzzSplit checks the stream splitter never returns more than it was given.
func FuzzSplit(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		for len(b) > 0 {
			p, n, err := Split(b)
			if err != nil || n == 0 {
				return
			}
			if n > len(b) || len(p) != n {
				t.Fatalf("split returned %d of %d", n, len(b))
			}
			b = b[n:]
		}
	})
}

func fuzzBody(f *testing.F, t PacketType) {
	for _, v := range vectors {
		if v.msg.Type() == t {
			b, _ := v.msg.Append(nil)
			f.Add(b[HeaderLen:])
		}
	}
	f.Fuzz(func(tt *testing.T, body []byte) {
		m := New(t)
		if err := m.Decode(body); err != nil {
			return
		}
		roundTrip(tt, m)
	})
}

func FuzzHandshakeRequest(f *testing.F)   { fuzzBody(f, TypeHandshakeRequest) }
func FuzzHandshakeResponse(f *testing.F)  { fuzzBody(f, TypeHandshakeResponse) }
func FuzzExtendedAuth(f *testing.F)       { fuzzBody(f, TypeExtendedAuth) }
func FuzzTunnelCreate(f *testing.F)       { fuzzBody(f, TypeTunnelCreate) }
func FuzzTunnelResponse(f *testing.F)     { fuzzBody(f, TypeTunnelResponse) }
func FuzzTunnelAuth(f *testing.F)         { fuzzBody(f, TypeTunnelAuth) }
func FuzzTunnelAuthResponse(f *testing.F) { fuzzBody(f, TypeTunnelAuthResponse) }
func FuzzChannelCreate(f *testing.F)      { fuzzBody(f, TypeChannelCreate) }
func FuzzChannelResponse(f *testing.F)    { fuzzBody(f, TypeChannelResponse) }
func FuzzData(f *testing.F)               { fuzzBody(f, TypeData) }
func FuzzServiceMessage(f *testing.F)     { fuzzBody(f, TypeServiceMessage) }
func FuzzReauthMessage(f *testing.F)      { fuzzBody(f, TypeReauthMessage) }
func FuzzCloseChannel(f *testing.F)       { fuzzBody(f, TypeCloseChannel) }
func FuzzCloseChannelResponse(f *testing.F) {
	fuzzBody(f, TypeCloseChannelResponse)
}
