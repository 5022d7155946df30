package nbdroot

import (
	"encoding/hex"
	"strings"
	"testing"

	"github.com/deskway/deskway/internal/nbdclient"
)

func TestParseCmdline(t *testing.T) {
	p, err := ParseCmdline("initrd=initrd console=ttyS0 deskway.device=pc1 deskway.export=golden@test/pc1/0123456789abcdef deskway.mode=standard deskway.servers=10.77.0.1:10809,10.77.0.2:10809\n")
	if err != nil || p.Device != "pc1" || p.Export != "golden@test/pc1/0123456789abcdef" || strings.Join(p.Servers, " ") != "10.77.0.1:10809 10.77.0.2:10809" {
		t.Fatalf("%+v %v", p, err)
	}
	for in, want := range map[string]string{
		"console=ttyS0": "no deskway.export",
		"deskway.export=golden/pc1/b deskway.servers=":     "no deskway.export",
		"deskway.export=golden/pc1/b deskway.servers=host": `"host" is not host:port`,
	} {
		if _, err := ParseCmdline(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", in, err, want)
		}
	}
}

// TestNetlinkAttributes pins the NBD_CMD_CONNECT and NBD_CMD_RECONFIGURE
// attributes to include/uapi/linux/nbd-netlink.h, byte by byte (netlink
// is host-endian: little-endian here): device 0, 64 MiB, 512-byte blocks,
// server flags 0x0d, a 15 s request timeout, 300 s for a dead
// connection, and socket 5 as [NBD_ATTR_SOCKETS [NBD_SOCK_ITEM [NBD_SOCK_FD]]]
// with the nested flag (0x8000) on both containers.
func TestNetlinkAttributes(t *testing.T) {
	sock := "1000" + "0780" + "0c00" + "0180" + "0800" + "0100" + "05000000"
	for name, tc := range map[string]struct {
		got  func() ([]byte, error)
		want string
	}{
		"connect": {func() ([]byte, error) { return connectAttrs(0, nbdclient.Export{Size: 64 << 20, Flags: 0x0d}, 5) }, "" +
			"0800" + "0100" + "00000000" + // index 0
			"0c00" + "0200" + "0000000400000000" + // 64 MiB
			"0c00" + "0300" + "0002000000000000" + // 512
			"0c00" + "0500" + "0d00000000000000" + // server flags
			"0c00" + "0400" + "0f00000000000000" + // 15 s
			"0c00" + "0800" + "2c01000000000000" + // 300 s
			sock},
		"reconfigure": {func() ([]byte, error) { return reconfigureAttrs(3, 5) }, "0800" + "0100" + "03000000" + sock},
	} {
		b, err := tc.got()
		if err != nil || hex.EncodeToString(b) != tc.want {
			t.Errorf("%s:\n got %x (%v)\nwant %s", name, b, err, tc.want)
		}
	}
}

func TestDeviceIndex(t *testing.T) {
	for dev, want := range map[string]int{"/dev/nbd0": 0, "/dev/nbd12": 12, "/dev/sda": -1, "/dev/nbd": -1, "nbdx": -1} {
		got, err := deviceIndex(dev)
		if want < 0 && err == nil || want >= 0 && (err != nil || got != uint32(want)) {
			t.Errorf("%s: %d %v, want %d", dev, got, err, want)
		}
	}
}
