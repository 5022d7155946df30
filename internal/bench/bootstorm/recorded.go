package bootstorm

import "time"

// Request is one request of the recorded boot.
type Request struct {
	At  time.Duration // since the boot's first request
	Cmd byte          // R, W, Z (write zeroes), F (flush), T (trim)
	Off int64
	Len uint32
}

// RecordedBoot returns the requests of the committed boot trace in their
// order, for other benches that replay the same boot.
func RecordedBoot() ([]Request, error) {
	tr, err := parseTrace(defaultTrace)
	if err != nil {
		return nil, err
	}
	out := make([]Request, len(tr.ops))
	for i, o := range tr.ops {
		out[i] = Request{At: o.at, Cmd: o.cmd, Off: o.off, Len: o.n}
	}
	return out, nil
}
