package stream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sync/semaphore"
	"golang.org/x/sys/unix"

	"github.com/deskway/deskway/internal/proto/nbd"
)

// transmit serves requests until the client sends NBD_CMD_DISC (disc is
// then true), hangs up, or breaks the protocol. Up to max_inflight
// requests run at once; replies go out as they finish.
func (c *conn) transmit(exp *export) (disc bool, err error) {
	// Workers, started as needed up to max_inflight, live as long as the
	// connection: a goroutine per request would grow a fresh stack for
	// every one, and in a boot storm that copying showed in profiles.
	type job struct {
		req     nbd.Request
		payload []byte
		staged  *stagedWrite // a WRITE received straight into the cache
		cost    int64        // bytes reserved from the buffer budgets
	}
	// What requests in progress may hold is bounded per connection and
	// over all of them: the reader waits for budget before it takes the
	// next request, so a client that asks for much and reads nothing
	// holds at most connBudget until its write timeout ends it.
	budget := semaphore.NewWeighted(connBudget)
	run := func(j job) {
		c.serve(exp, j.req, j.payload, j.staged)
		if j.payload != nil {
			c.s.bufs.put(j.payload)
		}
		if j.cost > 0 {
			c.s.buffers.Release(j.cost)
			budget.Release(j.cost)
		}
	}
	reserve := func(n int64) error {
		if err := budget.Acquire(context.Background(), n); err != nil {
			return err
		}
		if err := c.s.buffers.Acquire(context.Background(), n); err != nil {
			budget.Release(n)
			return err
		}
		return nil
	}
	jobs := make(chan job)
	workers := 0
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(jobs)
	dispatch := func(j job) {
		select {
		case jobs <- j: // an idle worker took it
			return
		default:
		}
		if workers < c.s.cfg.MaxInflight {
			workers++
			wg.Add(1)
			go func() {
				defer wg.Done()
				run(j)
				for j := range jobs {
					run(j)
				}
			}()
			return
		}
		jobs <- j
	}
	var hdr [nbd.RequestLen]byte
	for {
		if _, err := io.ReadFull(c.r, hdr[:]); err != nil {
			return false, err
		}
		var req nbd.Request
		if err := req.Decode(hdr[:]); err != nil {
			return false, err
		}
		var payload []byte
		var cost int64
		if req.Cmd == nbd.CmdWrite {
			if req.Length > maxPayload {
				// The payload cannot be skipped safely at this size.
				return false, fmt.Errorf("NBD_CMD_WRITE of %d bytes over the %d-byte maximum", req.Length, maxPayload)
			}
			if st := stageWrite(exp, req); st != nil {
				if err := st.receive(c.r); err != nil {
					st.abort()
					return false, err
				}
				dispatch(job{req: req, staged: st})
				continue
			}
			cost = int64(req.Length)
			if err := reserve(cost); err != nil {
				return false, err
			}
			payload = c.s.bufs.get(int(req.Length))
			if _, err := io.ReadFull(c.r, payload); err != nil {
				// A client that hangs up mid-write: nothing of it is stored.
				c.s.bufs.put(payload)
				c.s.buffers.Release(cost)
				budget.Release(cost)
				return false, err
			}
		}
		if req.Cmd == nbd.CmdDisc {
			return true, nil
		}
		if req.Cmd == nbd.CmdRead && req.Length <= maxPayload {
			cost = int64(req.Length)
			if err := reserve(cost); err != nil {
				return false, err
			}
		}
		dispatch(job{req: req, payload: payload, cost: cost})
	}
}

// connBudget is what the requests in progress on one connection may hold
// in buffers: two of the largest.
const connBudget = 2 * maxPayload

// stageWrite sets req up to be received straight into its boot's RAM
// write cache, when it goes there and is large enough; nil otherwise.
func stageWrite(exp *export, req nbd.Request) *stagedWrite {
	wc, ok := exp.view.(*writeCache)
	end := req.Offset + uint64(req.Length)
	if !ok || exp.readOnly || end < req.Offset || end > uint64(exp.vd.size) {
		return nil
	}
	return wc.stage(int64(req.Offset), int64(req.Length))
}

// serve runs one request and sends its reply; a WRITE's data is payload,
// or staged in the cache already.
func (c *conn) serve(exp *export, req nbd.Request, payload []byte, staged *stagedWrite) {
	c.count(exp, req)
	if req.Cmd != nbd.CmdRead {
		c.send(c.execute(nil, exp, req, payload, staged))
		return
	}
	if r := c.checkRead(exp, req); r != nil {
		c.send(r)
		return
	}
	if c.sendBase(exp, req) {
		c.s.metrics.readBytes.Add(float64(req.Length))
		return
	}
	buf := c.s.bufs.get(int(req.Length))
	defer c.s.bufs.put(buf)
	if r := c.readView(exp, req, buf); r != nil {
		c.send(r)
		return
	}
	c.sendData(req, buf)
}

// count records a request in the metrics and the trace.
func (c *conn) count(exp *export, req nbd.Request) {
	c.s.metrics.request(req.Cmd).Inc()
	if c.s.trace != nil && exp.boot != nil {
		c.s.trace.record(exp.boot, req)
	}
}

// checkRead returns the error reply for a READ that cannot be served,
// nil for one that can.
func (c *conn) checkRead(exp *export, req nbd.Request) []byte {
	size := uint64(exp.vd.size)
	end := req.Offset + uint64(req.Length)
	switch {
	case req.Length > maxPayload:
		return c.fail(req, nbd.EINVAL, "read of %d bytes over the %d-byte maximum", req.Length, maxPayload)
	case end < req.Offset || end > size:
		return c.fail(req, nbd.EINVAL, "read past the end of the %d-byte disk", size)
	}
	return nil
}

// readView reads what req asks for from the client's view into buf, of
// req.Length bytes; on failure it returns the error reply.
func (c *conn) readView(exp *export, req nbd.Request, buf []byte) []byte {
	var err error
	if exp.view != nil {
		_, err = exp.view.ReadAt(buf, int64(req.Offset))
	} else {
		_, err = exp.img.ReadAt(buf, int64(req.Offset))
	}
	if err != nil {
		c.s.log.Error("read failed", "vdisk", exp.vd.name, "offset", req.Offset, "err", err)
		return c.fail(req, nbd.EIO, "read failed")
	}
	c.s.metrics.readBytes.Add(float64(len(buf)))
	return nil
}

// baseRange reports whether a READ's range holds nothing but bytes of
// the base file, which can then go out with sendfile.
func baseRange(exp *export, req nbd.Request) bool {
	off, n := int64(req.Offset), int64(req.Length)
	return n > 0 && (exp.view == nil || exp.view.baseOnly(off, n)) && exp.img.baseFile(off, n)
}

// execute runs a request other than READ and appends its reply to dst; a
// WRITE's data is payload, or staged in the cache already.
func (c *conn) execute(dst []byte, exp *export, req nbd.Request, payload []byte, staged *stagedWrite) []byte {
	m := c.s.metrics
	size := uint64(exp.vd.size)
	end := req.Offset + uint64(req.Length)
	inBounds := end >= req.Offset && end <= size
	switch req.Cmd {
	case nbd.CmdWrite, nbd.CmdWriteZeroes, nbd.CmdTrim:
		switch {
		case exp.readOnly:
			return append(dst, c.fail(req, nbd.EPERM, "export is read-only; open VDISK/CLIENT/BOOT for a writable view")...)
		case !inBounds && req.Cmd == nbd.CmdTrim:
			return append(dst, c.fail(req, nbd.EINVAL, "trim past the end of the %d-byte disk", size)...)
		case !inBounds:
			return append(dst, c.fail(req, nbd.ENOSPC, "write past the end of the %d-byte disk", size)...)
		}
		if exp.boot != nil && req.Cmd != nbd.CmdTrim {
			need := exp.view.unheld(int64(req.Offset), int64(req.Length), req.Cmd == nbd.CmdWriteZeroes) * cacheBlock
			if err := exp.boot.acct.reserve(need); err != nil {
				if staged != nil {
					staged.abort()
				}
				c.s.cacheFull(exp.boot, err)
				return append(dst, c.fail(req, nbd.ENOSPC, "%s", err)...)
			}
			defer exp.boot.acct.unreserve(need)
		}
		var err error
		exp.wrote.Store(true)
		switch req.Cmd {
		case nbd.CmdWrite:
			if staged != nil {
				err = staged.commit()
			} else {
				_, err = exp.view.WriteAt(payload, int64(req.Offset))
			}
			m.writeBytes.Add(float64(req.Length))
		case nbd.CmdWriteZeroes:
			err = exp.view.WriteZeroes(int64(req.Offset), int64(req.Length))
		case nbd.CmdTrim:
			exp.view.Trim(int64(req.Offset), int64(req.Length))
		}
		if err == nil && req.Flags&nbd.CmdFlagFUA != 0 {
			err = exp.view.Sync()
		}
		if err != nil {
			c.s.log.Error("write failed", "vdisk", exp.vd.name, "offset", req.Offset, "err", err)
			e := nbd.EIO
			if errors.Is(err, syscall.ENOSPC) {
				e = nbd.ENOSPC
			}
			return append(dst, c.fail(req, e, "write failed")...)
		}
		return c.ok(dst, req)
	case nbd.CmdFlush:
		if exp.view != nil {
			if err := exp.view.Sync(); err != nil {
				c.s.log.Error("flush failed", "vdisk", exp.vd.name, "err", err)
				return append(dst, c.fail(req, nbd.EIO, "flush failed")...)
			}
		}
		return c.ok(dst, req)
	case nbd.CmdCache:
		if !inBounds {
			return append(dst, c.fail(req, nbd.EINVAL, "cache request past the end of the disk")...)
		}
		return c.ok(dst, req)
	case nbd.CmdBlockStatus:
		switch {
		case !c.metaBase:
			return append(dst, c.fail(req, nbd.EINVAL, "no meta context selected (NBD_OPT_SET_META_CONTEXT base:allocation)")...)
		case req.Length == 0 || !inBounds:
			return append(dst, c.fail(req, nbd.EINVAL, "block status range outside the disk")...)
		}
		ext := exp.extents(int64(req.Offset), int64(req.Length), req.Flags&nbd.CmdFlagReqOne != 0)
		return nbd.AppendBlockStatusChunk(dst, nbd.ChunkFlagDone, req.Cookie, baseContextID, ext)
	}
	return append(dst, c.fail(req, nbd.EINVAL, "%s is not supported", req.Cmd)...)
}

// ok appends the reply to a request that succeeded without data.
func (c *conn) ok(dst []byte, req nbd.Request) []byte {
	if c.structured {
		return nbd.AppendChunkHeader(dst, nbd.ChunkHeader{Flags: nbd.ChunkFlagDone, Type: nbd.ChunkNone, Cookie: req.Cookie})
	}
	return nbd.AppendSimpleReply(dst, 0, req.Cookie)
}

// fail is the error reply to req; the message goes to structured clients.
func (c *conn) fail(req nbd.Request, e nbd.Errno, format string, a ...any) []byte {
	c.s.metrics.errors.WithLabelValues(e.String()).Inc()
	if c.structured {
		return nbd.AppendErrorChunk(nil, req.Cookie, e, fmt.Sprintf(format, a...))
	}
	return nbd.AppendSimpleReply(nil, e, req.Cookie)
}

// maxExtents bounds one block status reply; the client asks again for
// the rest.
const maxExtents = 256

// maxStatusSpan bounds the range one block status reply walks block by
// block where the client wrote: a reply may cover less than asked.
const maxStatusSpan = 256 << 20

// extents describes [off, off+n) for base:allocation layer by layer, as
// a reader of the view sees it: blocks the boot wrote are data (zeroes
// written as zeroes), blocks a newer version changed are data, and the
// rest is the base file, whose holes SEEK_DATA/SEEK_HOLE find. A private
// image is one file and is described the same way from that file.
// With one (NBD_CMD_FLAG_REQ_ONE) it is the first extent alone.
func (e *export) extents(off, n int64, one bool) []nbd.Extent {
	out := e.allExtents(off, n)
	if one && len(out) > 1 {
		out = out[:1]
	}
	return out
}

func (e *export) allExtents(off, n int64) []nbd.Extent {
	var out []nbd.Extent
	add := func(length int64, flags uint32) {
		if k := len(out); k > 0 && out[k-1].Flags == flags {
			out[k-1].Length += uint32(length)
			return
		}
		out = append(out, nbd.Extent{Length: uint32(length), Flags: flags})
	}
	end := off + n
	switch {
	case e.private != nil:
		fileExtents(e.private.f, off, end, add, &out)
		return out
	case (e.view == nil || e.view.baseOnly(off, n)) && e.img.baseFile(off, n):
		fileExtents(e.img.base, off, end, add, &out)
		return out
	}
	end = min(end, off+maxStatusSpan)
	const below, written, zeroed = 0, 1, 2
	layer := func(blk int64) int {
		if e.view != nil {
			switch e.view.source(blk) {
			case fromCacheData:
				return written
			case fromCacheZero:
				return zeroed
			}
		}
		if e.img.layer(blk) >= 0 {
			return written
		}
		return below
	}
	for pos := off; pos < end && len(out) < maxExtents; {
		l := layer(pos / cacheBlock)
		run := min((pos/cacheBlock+1)*cacheBlock, end)
		for run < end && layer(run/cacheBlock) == l {
			run = min(run+cacheBlock, end)
		}
		switch l {
		case written:
			add(run-pos, 0)
		case zeroed:
			add(run-pos, nbd.StateZero)
		default:
			fileExtents(e.img.base, pos, run, add, &out)
		}
		pos = run
	}
	return out
}

// fileExtents describes [pos, end) of f by its data and holes, through
// add, until out holds maxExtents; a filesystem that cannot tell makes it
// all data.
func fileExtents(f *os.File, pos, end int64, add func(int64, uint32), out *[]nbd.Extent) {
	for pos < end && len(*out) < maxExtents {
		next, err := f.Seek(pos, unix.SEEK_DATA)
		switch {
		case errors.Is(err, syscall.ENXIO): // only a hole from pos on
			add(end-pos, nbd.StateHole|nbd.StateZero)
			return
		case err != nil:
			add(end-pos, 0)
			return
		case next > pos:
			next = min(next, end)
			add(next-pos, nbd.StateHole|nbd.StateZero)
			pos = next
			continue
		}
		hole, err := f.Seek(pos, unix.SEEK_HOLE)
		if err != nil {
			add(end-pos, 0)
			return
		}
		hole = min(hole, end)
		add(hole-pos, 0)
		pos = hole
	}
}

// sendBase answers a READ straight from the base file with sendfile when
// the connection is plain TCP and nothing in the range was written; it
// reports whether it did.
func (c *conn) sendBase(exp *export, req nbd.Request) bool {
	tc, ok := c.rw.(*net.TCPConn)
	if !ok || !baseRange(exp, req) {
		return false
	}
	hdr := c.dataHeader(nil, req, int(req.Length))
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil {
		return true
	}
	_ = c.nc.SetWriteDeadline(time.Now().Add(c.s.cfg.WriteTimeout.D()))
	if err := sendFileReply(tc, hdr, exp.img.baseFD, int64(req.Offset), int(req.Length)); err != nil {
		c.werr = err
		c.nc.Close()
	}
	return true
}

// dataHeader appends the header of a READ's reply carrying n bytes. A
// structured reply to a zero-length READ is a lone NONE chunk, as nbdkit
// answers: libnbd refuses an OFFSET_DATA chunk without data.
func (c *conn) dataHeader(dst []byte, req nbd.Request, n int) []byte {
	if c.structured && n == 0 {
		return nbd.AppendChunkHeader(dst, nbd.ChunkHeader{Flags: nbd.ChunkFlagDone, Type: nbd.ChunkNone, Cookie: req.Cookie})
	}
	if c.structured {
		return nbd.AppendOffsetDataChunk(dst, nbd.ChunkFlagDone, req.Cookie, req.Offset, n)
	}
	return nbd.AppendSimpleReply(dst, 0, req.Cookie)
}

func (c *conn) sendData(req nbd.Request, data []byte) {
	c.send(c.dataHeader(nil, req, len(data)), data)
}

// send writes one whole reply; after a failed write the connection is
// closed so the reader stops too.
func (c *conn) send(parts ...[]byte) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil {
		return
	}
	bufs := net.Buffers(parts)
	_ = c.nc.SetWriteDeadline(time.Now().Add(c.s.cfg.WriteTimeout.D()))
	if _, err := bufs.WriteTo(c.rw); err != nil {
		c.werr = err
		c.nc.Close()
	}
}

func cmdLabel(cmd nbd.Cmd) string {
	switch cmd {
	case nbd.CmdRead:
		return "read"
	case nbd.CmdWrite:
		return "write"
	case nbd.CmdFlush:
		return "flush"
	case nbd.CmdTrim:
		return "trim"
	case nbd.CmdCache:
		return "cache"
	case nbd.CmdWriteZeroes:
		return "write_zeroes"
	case nbd.CmdBlockStatus:
		return "block_status"
	}
	return "other"
}
