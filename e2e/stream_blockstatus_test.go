package e2e

import (
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

// mapScript runs its arguments after the URI on the export: "w OFF"
// writes 64 KiB at OFF, "z OFF" zeroes 64 KiB there, "one OFF" asks for
// the status from OFF with NBD_CMD_FLAG_REQ_ONE and prints "one N" for
// the N extents the server sent, and "map" prints the base:allocation map
// with adjacent extents of one kind merged, one "offset length flags" a
// line, and a "--" line after it.
const mapScript = `
import nbd, sys
h = nbd.NBD()
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.connect_uri(sys.argv[1])
def show():
    ext = []
    def cb(meta, off, entries, err):
        if meta == nbd.CONTEXT_BASE_ALLOCATION:
            ext.extend(zip(entries[0::2], entries[1::2]))
    off, size = 0, h.get_size()
    while off < size:
        n = len(ext)
        h.block_status(size - off, off, cb)
        off += sum(l for l, _ in ext[n:])
    merged = []
    for l, f in ext:
        if merged and merged[-1][1] == f:
            merged[-1][0] += l
        else:
            merged.append([l, f])
    pos = 0
    for l, f in merged:
        print(pos, l, f)
        pos += l
    print("--")
for cmd in sys.argv[2:]:
    op, _, off = cmd.partition(" ")
    if op == "w":
        h.pwrite(b"w" * 65536, int(off))
    elif op == "z":
        h.zero(65536, int(off))
    elif op == "one":
        got = []
        def one(meta, o, entries, err):
            if meta == nbd.CONTEXT_BASE_ALLOCATION:
                got.extend(entries[0::2])
        h.block_status(h.get_size() - int(off), int(off), one, nbd.CMD_FLAG_REQ_ONE)
        print("one", len(got))
    else:
        show()
`

// blockMap runs mapScript on uri with cmds and returns what it printed.
func blockMap(t *testing.T, uri string, cmds ...string) string {
	t.Helper()
	testkit.Require(t, "/usr/bin/python3")
	out, err := exec.Command("/usr/bin/python3", append([]string{"-c", mapScript, uri}, cmds...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("block status of %s: %v\n%s", uri, err, out)
	}
	return string(out)
}

// TestStreamBlockStatusByLayer: after a client writes, block status still
// reports the base's holes and exactly the written blocks as data, as
// nbdkit's cow filter does over the same base: in a boot, in a private
// image and on a version whose delta changed blocks; zeroes written
// read as zero.
func TestStreamBlockStatusByLayer(t *testing.T) {
	parallel(t)
	testkit.Require(t, "nbdkit")
	r := startStream(t, "off", "1m")
	port := testkit.FreePort(t)
	cow := testkit.Start(t, nil, "nbdkit", "-f", "-i", "127.0.0.1", "-p", fmt.Sprint(port), "--filter=cow", "file", r.base)
	if err := testkit.WaitPort(fmt.Sprintf("127.0.0.1:%d", port), 10*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, cow.Log.String())
	}
	// 64 KiB into a base hole, over base data, and beside base data.
	writes := []string{"w 8388608", "w 1048576", "w 42008576"}
	cowURI := fmt.Sprintf("nbd://127.0.0.1:%d", port)
	want := blockMap(t, cowURI, append(writes, "map")...)
	if !strings.Contains(want, "8388608 65536 0\n") || strings.Count(want, "\n") < 7 {
		t.Fatalf("nbdkit cow map is not the one this test expects:\n%s", want)
	}
	got := blockMap(t, r.uri+"/golden/mapper/b1", append(writes, "map", "one 0", "z 20971520", "map")...)
	before, after, _ := strings.Cut(got, "--\n")
	if before+"--\n" != want {
		t.Errorf("boot map differs from nbdkit cow's\ndeskway:\n%s\nnbdkit cow:\n%s", before, want)
	}
	if !strings.Contains(after, "one 1\n") {
		t.Errorf("a status request with NBD_CMD_FLAG_REQ_ONE got other than one extent:\n%s", after)
	}
	if !strings.Contains(after, "20971520 65536 2\n") {
		t.Errorf("64 KiB of written zeroes at 20 MiB not reported as zero:\n%s", after)
	}
	if got := blockMap(t, r.uri+"/personal/alice", append(writes, "map")...); got != want {
		t.Errorf("private image map differs from nbdkit cow's\ndeskway:\n%s\nnbdkit cow:\n%s", got, want)
	}
	// A version that changed 64 KiB in a base hole: a boot of it writing
	// the same three blocks sees four, as cow does after four writes.
	var v struct {
		Version int `json:"version"`
	}
	r.api(t, "POST", "/api/v1/stream/vdisks/golden/versions", http.StatusCreated, &v)
	blockMap(t, r.uri+"/golden@maintenance/admin", "w 31457280")
	path := fmt.Sprintf("/api/v1/stream/vdisks/golden/versions/%d/promote", v.Version)
	r.api(t, "POST", path, http.StatusOK, nil)
	r.api(t, "POST", path, http.StatusOK, nil)
	want = blockMap(t, cowURI, "w 31457280", "map")
	if got := blockMap(t, r.uri+"/golden/mapper/b2", append(writes, "map")...); got != want {
		t.Errorf("map over a version's delta differs from nbdkit cow's\ndeskway:\n%s\nnbdkit cow:\n%s", got, want)
	}
}
