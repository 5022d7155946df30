package evloop

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Send is one write of a batch: P to the socket FD. SendAll fills in N,
// the bytes the socket took (0 when its buffer was full), and Err.
type Send struct {
	FD  int
	P   []byte
	N   int
	Err error
}

// SendAll writes every send of the batch without blocking, each as Write
// would, in one io_uring submission when the kernel offers io_uring and
// in one write system call each when it does not. A relay's round of
// events typically ends with one small write to each of many sockets;
// made apart, each write pays for a system call's entry and exit, which
// on a virtual machine with page-table isolation is much of what such a
// write costs.
//
// Two sends to one socket in a batch may complete out of order (the
// first refused for a full buffer, the second taken once it drained):
// give SendAll at most one send per socket. Loop goroutine only.
func (l *Loop) SendAll(sends []Send) {
	if l.ring == nil {
		for i := range sends {
			s := &sends[i]
			s.N, s.Err = Write(s.FD, s.P)
		}
		return
	}
	for len(sends) > 0 {
		k := min(len(sends), int(l.ring.entries))
		if err := l.ring.sendAll(sends[:k]); err != nil {
			l.ring.close()
			l.ring = nil
			l.SendAll(sends[k:])
			return
		}
		sends = sends[k:]
	}
}

// ring is an io_uring instance used only to make many sends in one
// system call: every send is on a non-blocking socket, so the kernel
// completes it during the submission, and the ring never holds work
// between calls.
type ring struct {
	fd      int
	entries uint32
	sqMem   []byte // the submission and completion rings (one mapping)
	sqeMem  []byte // the submission entries

	sqTail, sqMask *uint32
	sqArray        unsafe.Pointer
	cqHead, cqTail *uint32
	cqMask         *uint32
	cqes           unsafe.Pointer
}

// io_uring's ABI (include/uapi/linux/io_uring.h).
const (
	sysIOUringSetup   = 425
	sysIOUringEnter   = 426
	ioringOffSQRing   = 0
	ioringOffSQEs     = 0x10000000
	ioringFeatSingleM = 1 << 0 // IORING_FEAT_SINGLE_MMAP
	ioringOpSend      = 26
	ioringEnterGetEvs = 1 << 0
	sqeSize           = 64
	cqeSize           = 16
)

type sqringOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

type cqringOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

type uringParams struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFD uint32
	resv                                                                   [3]uint32
	sqOff                                                                  sqringOffsets
	cqOff                                                                  cqringOffsets
}

// newRing sets up a ring of the given size; it fails where the kernel has
// no io_uring or forbids it (kernel.io_uring_disabled, seccomp), and the
// loop then writes one call at a time.
func newRing(entries uint32) (*ring, error) {
	var p uringParams
	fd, _, e := unix.Syscall(sysIOUringSetup, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if e != 0 {
		return nil, fmt.Errorf("evloop: io_uring_setup: %w", e)
	}
	r := &ring{fd: int(fd), entries: p.sqEntries}
	if p.features&ioringFeatSingleM == 0 {
		r.close()
		return nil, fmt.Errorf("evloop: io_uring without IORING_FEAT_SINGLE_MMAP")
	}
	size := max(p.sqOff.array+p.sqEntries*4, p.cqOff.cqes+p.cqEntries*cqeSize)
	var err error
	r.sqMem, err = unix.Mmap(r.fd, ioringOffSQRing, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		r.close()
		return nil, fmt.Errorf("evloop: io_uring rings: %w", err)
	}
	r.sqeMem, err = unix.Mmap(r.fd, ioringOffSQEs, int(p.sqEntries*sqeSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		r.close()
		return nil, fmt.Errorf("evloop: io_uring entries: %w", err)
	}
	base := unsafe.Pointer(&r.sqMem[0])
	r.sqTail = (*uint32)(unsafe.Add(base, p.sqOff.tail))
	r.sqMask = (*uint32)(unsafe.Add(base, p.sqOff.ringMask))
	r.sqArray = unsafe.Add(base, p.sqOff.array)
	r.cqHead = (*uint32)(unsafe.Add(base, p.cqOff.head))
	r.cqTail = (*uint32)(unsafe.Add(base, p.cqOff.tail))
	r.cqMask = (*uint32)(unsafe.Add(base, p.cqOff.ringMask))
	r.cqes = unsafe.Add(base, p.cqOff.cqes)
	return r, nil
}

func (r *ring) close() {
	if r.sqeMem != nil {
		_ = unix.Munmap(r.sqeMem)
	}
	if r.sqMem != nil {
		_ = unix.Munmap(r.sqMem)
	}
	unix.Close(r.fd)
}

// sendAll makes at most r.entries sends in one submission and waits for
// their completions, which a non-blocking socket posts during it. An
// error is the ring's own failure (it should never happen; see fail),
// after which the ring must not be used again.
func (r *ring) sendAll(sends []Send) error {
	tail := atomic.LoadUint32(r.sqTail)
	mask := *r.sqMask
	for i := range sends {
		s := &sends[i]
		idx := (tail + uint32(i)) & mask
		sqe := unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(&r.sqeMem[0]), uintptr(idx)*sqeSize)), sqeSize)
		clear(sqe)
		sqe[0] = ioringOpSend
		*(*int32)(unsafe.Pointer(&sqe[4])) = int32(s.FD)
		*(*uint64)(unsafe.Pointer(&sqe[16])) = uint64(bufPtr(s.P))
		*(*uint32)(unsafe.Pointer(&sqe[24])) = uint32(len(s.P))
		// A peer that has gone must give EPIPE, not a signal.
		*(*uint32)(unsafe.Pointer(&sqe[28])) = unix.MSG_NOSIGNAL | unix.MSG_DONTWAIT
		*(*uint64)(unsafe.Pointer(&sqe[32])) = uint64(i)
		*(*uint32)(unsafe.Add(r.sqArray, uintptr(idx)*4)) = idx
		s.N, s.Err = 0, errPending
	}
	// The kernel reads the entries once it sees the new tail.
	atomic.StoreUint32(r.sqTail, tail+uint32(len(sends)))
	toSubmit, done := len(sends), 0
	for stuck := 0; done < len(sends); {
		n, _, e := unix.RawSyscall6(sysIOUringEnter, uintptr(r.fd), uintptr(toSubmit), uintptr(len(sends)-done), ioringEnterGetEvs, 0, 0)
		before := done
		switch e {
		case 0:
			toSubmit -= int(n)
		case unix.EINTR, unix.EAGAIN, unix.EBUSY: // try again
		default:
			return r.fail(sends, toSubmit, e)
		}
		r.reap(sends, &done)
		if n > 0 || done > before {
			stuck = 0
		} else if stuck++; stuck == 100 { // a few signals may interrupt it, not a hundred
			return r.fail(sends, toSubmit, unix.EIO)
		}
	}
	return nil
}

// fail ends a submission the ring could not complete: the sends that
// never reached the kernel (the last unsubmitted) are written one call
// at a time, those it took and did not complete carry the error.
func (r *ring) fail(sends []Send, unsubmitted int, e unix.Errno) error {
	var done int
	r.reap(sends, &done)
	err := fmt.Errorf("evloop: io_uring_enter: %w", e)
	for i := range sends {
		s := &sends[i]
		switch {
		case s.Err != errPending:
		case i >= len(sends)-unsubmitted:
			s.N, s.Err = Write(s.FD, s.P)
		default:
			s.Err = err
		}
	}
	return err
}

// errPending marks a send whose completion has not been seen.
var errPending = errors.New("evloop: send not completed")

// reap records the completions posted so far.
func (r *ring) reap(sends []Send, done *int) {
	head := atomic.LoadUint32(r.cqHead)
	tail := atomic.LoadUint32(r.cqTail)
	mask := *r.cqMask
	for ; head != tail; head++ {
		cqe := unsafe.Add(r.cqes, uintptr(head&mask)*cqeSize)
		i := *(*uint64)(cqe)
		res := *(*int32)(unsafe.Add(cqe, 8))
		if i >= uint64(len(sends)) || sends[i].Err != errPending {
			continue
		}
		s := &sends[i]
		switch {
		case res >= 0:
			s.N, s.Err = int(res), nil
		case unix.Errno(-res) == unix.EAGAIN:
			s.N, s.Err = 0, nil
		case unix.Errno(-res) == unix.EINTR:
			s.N, s.Err = Write(s.FD, s.P)
		default:
			s.N, s.Err = 0, unix.Errno(-res)
		}
		*done++
	}
	atomic.StoreUint32(r.cqHead, head)
}
