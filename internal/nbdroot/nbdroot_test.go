package nbdroot

import (
	"strings"
	"testing"
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
