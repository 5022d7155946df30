package faults

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/deskway/deskway/internal/bench/bootstorm"
	"github.com/deskway/deskway/internal/nbdclient"
	"github.com/deskway/deskway/internal/nbdroot"
)

const sector = 512

// disk is what every client's disk must read as: the golden image under
// the client's own writes. The sectors the trace ever writes are indexed
// once, so each client keeps one small state slot per written sector.
type disk struct {
	base  []byte
	ops   []bootstorm.Request
	slot  []int32 // per sector of the disk: its state slot, or -1
	slots int
}

func newDisk(base []byte, ops []bootstorm.Request) *disk {
	d := &disk{base: base, ops: ops, slot: make([]int32, len(base)/sector)}
	for i := range d.slot {
		d.slot[i] = -1
	}
	for _, o := range ops {
		if o.Cmd != 'W' && o.Cmd != 'Z' {
			continue
		}
		for s := o.Off / sector; s < (o.Off+int64(o.Len))/sector; s++ {
			if d.slot[s] < 0 {
				d.slot[s] = int32(d.slots)
				d.slots++
			}
		}
	}
	return d
}

// stateBase is a sector's state while it holds the base's bytes; a
// write of zeroes that is the trace's request number n-1 leaves state -n,
// and a write of data state n.
const stateBase = 0

// pattern fills p (sectors from sector first) with what client's write
// number seq puts there: records naming the client, the write and the
// sector, so a block from another client, write or place never matches.
func pattern(p []byte, client, seq int, first int64) {
	for i := 0; i < len(p); i += 16 {
		copy(p[i:], "DWFS")
		binary.BigEndian.PutUint32(p[i+4:], uint32(client))
		binary.BigEndian.PutUint32(p[i+8:], uint32(seq))
		binary.BigEndian.PutUint32(p[i+12:], uint32(first+int64(i/sector)))
	}
}

// replayer is one client booting: it replays the recorded boot with its
// own writes, on a connection that deskway-nbdroot's path (nbdroot.Connect,
// the next server first) replaces when it dies, re-sending the requests
// that were in flight as the kernel does. A killed server's connections
// end at once, so the kernel's 15 s request timeout, which catches a
// server that is up but silent, plays no part and is not modelled.
type replayer struct {
	id      int
	export  string
	servers []string
	d       *disk
	state   []int32 // per slot
	depth   int
	scale   float64
	fault   *atomic.Int64 // when the server was killed (Unix ns), 0 before

	mu      sync.Mutex // guards the connection and the fields below
	conn    *nbdclient.Client
	booted  nbdclient.Export
	at      int // index of the server in use
	gen     int // connections replaced so far
	refused error
	gaveUp  error

	// Results, under mu.
	ioErr      error
	wrong      error
	acked      int           // writes acknowledged
	lost       int           // acknowledged writes read back wrong
	verified   int           // acknowledged writes read back right
	longest    time.Duration // the longest request
	across     time.Duration // the longest request held up by the fault
	replaced   time.Time     // when the last connection was replaced
	firstAfter time.Time     // first reply on a replaced connection
	finished   bool
}

// server returns the address of the server the client is on now.
func (r *replayer) server() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.servers[r.at]
}

// connect negotiates the export from server first on, through the
// same function deskway-nbdroot reconnects with. A server refusing the
// export because the boot's write cache is gone is the loud refusal the
// machine's disk fails with; deskway-nbdroot asks again for two minutes
// before it gives up, which changes nothing, so the bench stops asking.
// No server taking the boot within two minutes is an I/O error here (the
// kernel holds the disk's requests for five).
func (r *replayer) connect(ctx context.Context, first int) (*nbdclient.Client, int, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var refusal error
	logf := func(_ string, args ...any) {
		for _, a := range args {
			var oe *nbdclient.OptionError
			// Not "open on another server": that one passes once the
			// other server lets go, and is asked again.
			if err, ok := a.(error); ok && errors.As(err, &oe) &&
				(strings.Contains(oe.Message, "write cache was lost") || strings.Contains(oe.Message, "lost its write cache")) {
				refusal = err
				cancel()
			}
		}
	}
	p := nbdroot.Params{Export: r.export, Servers: r.servers}
	conn, ex, at, err := nbdroot.Connect(ctx, p, first, logf)
	if refusal != nil {
		return nil, 0, &refusedError{refusal}
	}
	if err != nil {
		return nil, 0, err
	}
	if r.conn != nil && (ex.Size != r.booted.Size || ex.Flags != r.booted.Flags) {
		conn.Close()
		return nil, 0, fmt.Errorf("%s on %s is not the disk the client booted from", r.export, r.servers[at])
	}
	r.booted = ex
	return nbdclient.New(conn, ex), at, nil
}

// refusedError is a server's loud refusal of a boot whose cache is lost.
type refusedError struct{ err error }

func (e *refusedError) Error() string { return e.err.Error() }
func (e *refusedError) Unwrap() error { return e.err }

// current is the live connection and its generation.
func (r *replayer) current() (*nbdclient.Client, int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.refused != nil {
		return nil, 0, r.refused
	}
	if r.gaveUp != nil {
		return nil, 0, r.gaveUp
	}
	return r.conn, r.gen, nil
}

// replace swaps the connection of generation gen, which died, for a new
// one; the requests waiting meanwhile wait on mu, as the kernel holds the
// disk's requests while deskway-nbdroot reconnects.
func (r *replayer) replace(ctx context.Context, gen int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gen != gen || r.refused != nil || r.gaveUp != nil {
		return
	}
	r.conn.Drop()
	c, at, err := r.connect(ctx, (r.at+1)%len(r.servers))
	var re *refusedError
	switch {
	case errors.As(err, &re):
		r.refused = err
	case err != nil:
		r.gaveUp = fmt.Errorf("client %d: no server took the boot back: %w", r.id, err)
	default:
		r.conn, r.at = c, at
		r.gen++
		r.replaced = time.Now()
	}
}

// do runs one request until it is answered, on whatever connection is
// live; a server's error reply is an I/O error the machine would see.
func (r *replayer) do(ctx context.Context, f func(*nbdclient.Client) error) error {
	start := time.Now()
	for {
		c, gen, err := r.current()
		if err != nil {
			return err
		}
		err = f(c)
		var se *nbdclient.ServerError
		switch {
		case err == nil:
			took := time.Since(start)
			r.mu.Lock()
			r.longest = max(r.longest, took)
			// A request in flight at the kill, or held while the
			// connection was replaced, waited on the fault.
			if f := r.fault.Load(); (f != 0 && start.UnixNano() < f) || (gen > 0 && start.Before(r.replaced)) {
				r.across = max(r.across, took)
			}
			if gen > 0 && r.firstAfter.IsZero() {
				r.firstAfter = time.Now()
			}
			r.mu.Unlock()
			return nil
		case errors.As(err, &se):
			return fmt.Errorf("client %d: I/O error: %w", r.id, err)
		case ctx.Err() != nil:
			return ctx.Err()
		}
		r.replace(ctx, gen)
	}
}

// check compares what a read of n bytes at off returned with what the
// client's disk holds there.
func (r *replayer) check(p []byte, off int64) error {
	want := make([]byte, sector)
	for i := 0; i < len(p); {
		s := (off + int64(i)) / sector
		sl := r.d.slot[s]
		if sl < 0 {
			// A run of sectors the trace never writes: the base's.
			j := i + sector
			for j < len(p) && r.d.slot[(off+int64(j))/sector] < 0 {
				j += sector
			}
			if !bytes.Equal(p[i:j], r.d.base[off+int64(i):off+int64(j)]) {
				return fmt.Errorf("client %d: %d bytes at %d differ from the golden image, which the client never wrote there", r.id, j-i, off+int64(i))
			}
			i = j
			continue
		}
		st := r.state[sl]
		switch {
		case st == stateBase:
			copy(want, r.d.base[s*sector:])
		case st < 0:
			clear(want)
		default:
			pattern(want, r.id, int(st), s)
		}
		if !bytes.Equal(p[i:i+sector], want) {
			return fmt.Errorf("client %d: sector %d is not what the client last wrote there (state %d)", r.id, s, st)
		}
		i += sector
	}
	return nil
}

// written marks the sectors of request seq as holding its data.
func (r *replayer) written(o bootstorm.Request, seq int32) {
	for s := o.Off / sector; s < (o.Off+int64(o.Len))/sector; s++ {
		r.state[r.d.slot[s]] = seq
	}
}

// run replays the boot at its recorded pace (times scale), with up to
// depth requests in flight; a request never overlaps a write in flight,
// so every read has one right answer. acked is told of each write
// acknowledged.
func (r *replayer) run(ctx context.Context, acked func()) {
	c, at, err := r.connect(ctx, 0)
	r.mu.Lock()
	r.conn, r.at = c, at
	r.mu.Unlock()
	if err != nil {
		r.fail(err)
		return
	}
	start := time.Now()
	var wg sync.WaitGroup
	var fmu sync.Mutex // guards inflight and stop
	cond := sync.NewCond(&fmu)
	inflight := map[int]bootstorm.Request{}
	var stop error
	overlaps := func(o bootstorm.Request) bool {
		for _, f := range inflight {
			if (o.Cmd != 'R' || f.Cmd != 'R') && o.Off < f.Off+int64(f.Len) && f.Off < o.Off+int64(o.Len) {
				return true
			}
		}
		return false
	}
	for i, o := range r.d.ops {
		if o.Cmd == 'T' {
			continue // a trim leaves the disk's bytes undefined: nothing to check
		}
		if wait := time.Duration(float64(o.At)*r.scale) - time.Since(start); wait > 0 {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
			}
		}
		fmu.Lock()
		for stop == nil && ctx.Err() == nil && (len(inflight) >= r.depth || overlaps(o)) {
			cond.Wait()
		}
		if stop != nil || ctx.Err() != nil {
			fmu.Unlock()
			break
		}
		inflight[i] = o
		fmu.Unlock()
		seq := int32(i + 1)
		if o.Cmd == 'W' || o.Cmd == 'Z' {
			r.mu.Lock()
			r.acked++ // counted back below if it fails
			r.mu.Unlock()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := r.request(ctx, o, seq)
			fmu.Lock()
			delete(inflight, i)
			if err != nil && stop == nil {
				stop = err
			}
			cond.Broadcast()
			fmu.Unlock()
			if err == nil && (o.Cmd == 'W' || o.Cmd == 'Z') {
				acked()
			}
		}()
	}
	// A waiter must see the context end.
	go func() {
		<-ctx.Done()
		fmu.Lock()
		cond.Broadcast()
		fmu.Unlock()
	}()
	wg.Wait()
	if stop == nil {
		stop = ctx.Err()
	}
	if stop != nil {
		r.fail(stop)
		return
	}
	r.verify(ctx)
}

// request sends o and checks a read's answer.
func (r *replayer) request(ctx context.Context, o bootstorm.Request, seq int32) error {
	switch o.Cmd {
	case 'R':
		p := make([]byte, o.Len)
		if err := r.do(ctx, func(c *nbdclient.Client) error { _, err := c.ReadAt(p, o.Off); return err }); err != nil {
			return err
		}
		if err := r.check(p, o.Off); err != nil {
			r.mu.Lock()
			if r.wrong == nil {
				r.wrong = err
			}
			r.mu.Unlock()
		}
	case 'W':
		p := make([]byte, o.Len)
		for s := int64(0); s < int64(o.Len)/sector; s++ {
			pattern(p[s*sector:(s+1)*sector], r.id, int(seq), o.Off/sector+s)
		}
		// The sectors hold the new data once it is acknowledged; no read
		// of them is in flight meanwhile.
		if err := r.do(ctx, func(c *nbdclient.Client) error { return c.WriteAt(p, o.Off, false) }); err != nil {
			r.unacked()
			return err
		}
		r.written(o, seq)
	case 'Z':
		if err := r.do(ctx, func(c *nbdclient.Client) error { return c.WriteZeroes(o.Off, o.Len) }); err != nil {
			r.unacked()
			return err
		}
		r.written(o, -seq)
	case 'F':
		return r.do(ctx, func(c *nbdclient.Client) error { return c.Flush() })
	}
	return nil
}

func (r *replayer) unacked() {
	r.mu.Lock()
	r.acked--
	r.mu.Unlock()
}

// verify reads back every sector the client wrote: each acknowledged
// write whose last sectors read back otherwise is lost.
func (r *replayer) verify(ctx context.Context) {
	seen := map[[2]int64]bool{}
	bad, good := map[int32]bool{}, map[int32]bool{}
	for _, o := range r.d.ops {
		if o.Cmd != 'W' && o.Cmd != 'Z' || seen[[2]int64{o.Off, int64(o.Len)}] {
			continue
		}
		seen[[2]int64{o.Off, int64(o.Len)}] = true
		p := make([]byte, o.Len)
		if err := r.do(ctx, func(c *nbdclient.Client) error { _, err := c.ReadAt(p, o.Off); return err }); err != nil {
			r.fail(err)
			return
		}
		// Each write is judged by the sectors it still holds.
		for s := int64(0); s < int64(o.Len)/sector; s++ {
			at := o.Off + s*sector
			st := r.state[r.d.slot[at/sector]]
			if err := r.check(p[s*sector:(s+1)*sector], at); err != nil {
				bad[st] = true
				r.mu.Lock()
				if r.wrong == nil {
					r.wrong = err
				}
				r.mu.Unlock()
			} else {
				good[st] = true
			}
		}
	}
	delete(bad, stateBase)
	delete(good, stateBase)
	r.mu.Lock()
	r.lost = len(bad)
	for st := range good {
		if !bad[st] {
			r.verified++
		}
	}
	r.finished = true
	c := r.conn
	r.mu.Unlock()
	// The boot ends cleanly: NBD_CMD_DISC after its writes.
	_ = c.Close()
}

// fail ends the client's boot on err, sorted into a refusal or an I/O
// error.
func (r *replayer) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var re *refusedError
	switch {
	case errors.As(err, &re):
		r.refused = err
	case r.ioErr == nil:
		r.ioErr = err
	}
	if r.conn != nil {
		go r.conn.Drop()
	}
}

// medianDuration is the median of ds, or 0.
func medianDuration(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}
