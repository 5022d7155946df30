package gateway_test

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/deskway/deskway/internal/proto/x224"
)

// TestBrowserKeyboardLayout: the browser's client sends keyboard layout
// 0, for which xrdp maps keys as US English; the page names the
// person's layout on the websocket URL and the host gets it in the
// Connect Initial's core data. Without it, or with a value that is no
// layout, the host gets the client's 0.
func TestBrowserKeyboardLayout(t *testing.T) {
	for _, c := range []struct {
		path string
		want uint32
	}{
		{"/rdp?kbd=040c", 0x040C},
		{"/rdp?kbd=00000407", 0x0407},
		{"/rdp", 0},
		{"/rdp?kbd=zz", 0},
		{"/rdp?kbd=0", 0},
	} {
		t.Run(c.path, func(t *testing.T) {
			_, host, b := sessionAt(t, c.path, nil, x224.ProtocolSSL, nil)
			b.send(t, connectInitialBuild(0, nil, "cliprdr"))
			want := connectInitialBuild(raisedBuild, nil, "cliprdr")
			// The core data's keyboardLayout: 12 bytes into its body, which
			// connectInitialBuild's client build (16 in) follows.
			at := bytes.Index(want, []byte{0x01, 0xc0, 0xd8, 0x00}) + 4 + 12
			binary.LittleEndian.PutUint32(want[at:], c.want)
			if got := recv(t, host); !bytes.Equal(got, want) {
				t.Fatalf("the host got\n%x\nwant\n%x", got, want)
			}
		})
	}
}
