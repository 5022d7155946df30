// Package bootstorm rebuilds the desktop-streaming paper's boot storm:
// N diskless clients boot at once from one vDisk, each replaying the
// requests of a real boot recorded by deskway stream, against deskway and
// the stock NBD servers with per-client or shared copy-on-write, and the
// paper's tables are written beside theirs.
package bootstorm

import (
	"bufio"
	"bytes"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// defaultTrace is one diskless boot of Debian's kernel and a busybox
// userland loading programs and libraries from an ext4 vDisk, recorded by
// the e2e test TestStreamBootTwoVMs (DESKWAY_BOOT_TRACE_OUT rewrites it).
//
//go:embed boot-trace.csv
var defaultTrace []byte

// op is one request of a trace.
type op struct {
	at  time.Duration // since the boot's first request
	cmd byte          // R, W, Z (write zeroes), F (flush), T (trim)
	off int64
	n   uint32
}

// trace is a parsed boot.
type trace struct {
	ops        []op
	end        int64 // highest byte touched
	readBytes  int64
	writeBytes int64
	maxLen     uint32
	span       time.Duration
}

func parseTrace(b []byte) (*trace, error) {
	t := &trace{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	line := 0
	for sc.Scan() {
		line++
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		f := strings.Split(s, ",")
		if len(f) != 4 || len(f[1]) != 1 || !strings.Contains("RWZFT", f[1]) {
			return nil, fmt.Errorf("trace line %d: want ms,op,offset,length with op one of R W Z F T: %q", line, s)
		}
		ms, err1 := strconv.ParseFloat(f[0], 64)
		off, err2 := strconv.ParseInt(f[2], 10, 64)
		n, err3 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil || err3 != nil || off < 0 || ms < 0 {
			return nil, fmt.Errorf("trace line %d: bad number in %q", line, s)
		}
		o := op{at: time.Duration(ms * float64(time.Millisecond)), cmd: f[1][0], off: off, n: uint32(n)}
		t.ops = append(t.ops, o)
		t.end = max(t.end, off+int64(n))
		t.span = max(t.span, o.at)
		switch o.cmd {
		case 'R':
			t.readBytes += int64(n)
			t.maxLen = max(t.maxLen, o.n)
		case 'W':
			t.writeBytes += int64(n)
			t.maxLen = max(t.maxLen, o.n)
		}
	}
	if len(t.ops) == 0 {
		return nil, fmt.Errorf("trace has no requests")
	}
	// Times count from the first request.
	first := t.ops[0].at
	for i := range t.ops {
		t.ops[i].at -= first
	}
	t.span -= first
	return t, nil
}

// reads returns the trace's reads alone, for the read test.
func (t *trace) reads() []op {
	var rs []op
	for _, o := range t.ops {
		if o.cmd == 'R' {
			rs = append(rs, o)
		}
	}
	return rs
}
