package e2e

import (
	"strings"
	"syscall"
	"testing"
)

// TestStreamFixedNameClientGetsBack: a client with a fixed export name
// (VDISK/CLIENT, no boot id) that stayed away past the reconnect window
// has its boot refused, as any lost boot is; rebooting cannot help it,
// since it boots under the same name every time. Forgetting the lost
// boot (deskway stream forget-lost) lets its next connection start
// afresh, and the forgetting outlives a restart of the server.
func TestStreamFixedNameClientGetsBack(t *testing.T) {
	parallel(t)
	r := startStream(t, "off", "1s")
	a := r.uri + "/golden/vmFixed"
	killedAfterWrite(t, a, "write -P 0x77 0 4096")
	r.waitBootDiscarded(t)
	expectRefused(t, a, true, "deskway stream forget-lost golden vmFixed", "a fixed-name client's lost boot was served, or refused without the way back",
		"read -P 0x77 0 4096")
	// Still refused after a restart: the loss is in the boot log.
	r.restart(t, syscall.SIGTERM)
	expectRefused(t, a, true, "write cache was lost", "a lost boot was served after a restart", "read -P 0x77 0 4096")

	out := runOK(t, r.bin, "stream", "forget-lost", "golden", "vmFixed", "-c", r.cfg)
	if !strings.Contains(out, "forgot lost boot golden/vmFixed/") {
		t.Fatalf("forget-lost did not name the boot it forgot:\n%s", out)
	}
	if out := runOK(t, r.bin, "stream", "forget-lost", "golden", "vmFixed", "-c", r.cfg); !strings.Contains(out, "no lost boot") {
		t.Fatalf("a second forget-lost found something:\n%s", out)
	}
	r.restart(t, syscall.SIGTERM)
	// A new boot under the same name: the vDisk as published.
	runOK(t, "qemu-img", "compare", "-f", "raw", "-F", "raw", r.base, a)
}
