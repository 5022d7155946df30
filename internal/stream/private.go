package stream

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
)

// errNoPrivate means a client asked for a private image no one made.
var errNoPrivate = errors.New("no private image")

// errWriterBusy means a private image already has its one writer.
var errWriterBusy = errors.New("the private image is open for writing by another connection (private mode allows one writer); a machine that powered off without disconnecting holds it until the server drops its connection, within 25 s")

// privateImage is one client's own writable copy of a vDisk (private
// mode). It persists across boots; an exclusive flock on its lock file
// admits one writer at a time, across every server sharing the store.
type privateImage struct {
	f    *os.File
	lock *os.File // PATH.lock, flocked while this writer lives
}

// openPrivate takes the writer lock of the image at path, then opens the
// image, creating it on first use as a copy of from (the vDisk's newest
// production version). The lock comes first and lives in a file of its
// own: two first connections racing would otherwise both make a copy,
// the second renamed over the first while its writer still held it.
//
// Without create nothing is made on disk for an image that does not
// exist: with stream.clients open anyone can name any client, and each
// name would otherwise leave a lock file behind. An image is renamed into
// place only when complete, so one seen here is whole.
func openPrivate(path string, from *image, create bool) (*privateImage, error) {
	if !create {
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			return nil, errNoPrivate
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("private image: %w", err)
	}
	lock, err := os.OpenFile(path+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("private image lock: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errWriterBusy
		}
		return nil, fmt.Errorf("private image lock: %w", err)
	}
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		if !create {
			lock.Close()
			return nil, errNoPrivate
		}
		if err := from.flatten(path); err != nil {
			lock.Close()
			return nil, fmt.Errorf("private image: %w", err)
		}
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("private image: %w", err)
	}
	return &privateImage{f: f, lock: lock}, nil
}

// sparseCopy copies the data segments of base to a new file at path (in
// the kernel, with copy_file_range), leaving holes as holes, lets then
// change the copy, and renames it into place only when complete.
func sparseCopy(path string, base *os.File, size int64, then func(*os.File) error) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), copyPrefix+"*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	// Held while the copy is made, so that a server starting on the same
	// store (removePartialCopies) tells it from one a dead process left.
	if err := syscall.Flock(int(tmp.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return fmt.Errorf("lock %s: %w", tmp.Name(), err)
	}
	// A separate descriptor: the shared one is read with pread elsewhere,
	// and this copy moves its offset.
	src, err := os.Open(base.Name())
	if err != nil {
		return err
	}
	defer src.Close()
	const seekData, seekHole = 3, 4
	for off := int64(0); off < size; {
		data, err := src.Seek(off, seekData)
		if err != nil {
			break // ENXIO: no data after off
		}
		hole, err := src.Seek(data, seekHole)
		if err != nil {
			return err
		}
		if err := copyRange(tmp, src, data, min(hole, size)-data); err != nil {
			return err
		}
		off = hole
	}
	if err := tmp.Truncate(size); err != nil {
		return err
	}
	if then != nil {
		if err := then(tmp); err != nil {
			return err
		}
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// copyPrefix starts the name of a copy in progress, renamed into place
// only when complete.
const copyPrefix = ".copy-"

// removePartialCopies removes from dir the copies in progress that no
// process holds: what a server killed while copying (a first-use private
// image, a merge) left, which nothing else would ever remove. It returns
// how many files and bytes went.
func removePartialCopies(dir string) (files int, size int64, err error) {
	paths, _ := filepath.Glob(filepath.Join(dir, copyPrefix+"*"))
	for _, p := range paths {
		f, oerr := os.Open(p)
		if oerr != nil {
			continue // gone meanwhile: renamed into place, or removed
		}
		// A copy another server on the shared store is making holds the lock.
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			var st syscall.Stat_t
			if syscall.Fstat(int(f.Fd()), &st) == nil {
				size += st.Blocks * 512
			}
			if rerr := os.Remove(p); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
				err = fmt.Errorf("stream: remove a partial copy: %w", rerr)
			} else {
				files++
			}
		}
		f.Close()
	}
	return files, size, err
}

// copyRange copies [off, off+n) of src to the same place in dst, in the
// kernel where it can (os.File.ReadFrom uses copy_file_range). Where src
// ends early the rest reads as zeroes, as readFull has it.
func copyRange(dst, src *os.File, off, n int64) error {
	if _, err := src.Seek(off, io.SeekStart); err != nil {
		return err
	}
	if _, err := dst.Seek(off, io.SeekStart); err != nil {
		return err
	}
	c, err := dst.ReadFrom(&io.LimitedReader{R: src, N: n})
	if err != nil {
		return err
	}
	if c < n {
		zero := make([]byte, min(n-c, 1<<16))
		for left := n - c; left > 0; left -= int64(len(zero)) {
			if _, err := dst.Write(zero[:min(left, int64(len(zero)))]); err != nil {
				return err
			}
		}
	}
	return nil
}

// ReadAt reads the client's image.
func (p *privateImage) ReadAt(b []byte, off int64) (int, error) { return readFull(p.f, b, off) }

// WriteAt writes into the client's image.
func (p *privateImage) WriteAt(b []byte, off int64) (int, error) { return p.f.WriteAt(b, off) }

// WriteZeroes punches a hole (reading back as zeroes) where the file
// system can, and writes zeroes where it cannot.
func (p *privateImage) WriteZeroes(off, n int64) error {
	const punchHole, keepSize = 0x02, 0x01
	if err := syscall.Fallocate(int(p.f.Fd()), punchHole|keepSize, off, n); err == nil {
		return nil
	}
	z := make([]byte, min(n, 1<<20))
	for done := int64(0); done < n; {
		k := min(int64(len(z)), n-done)
		if _, err := p.f.WriteAt(z[:k], off+done); err != nil {
			return err
		}
		done += k
	}
	return nil
}

// Sync makes the image durable.
func (p *privateImage) Sync() error { return p.f.Sync() }

// Trim keeps the client's bytes; the image is its disk.
func (p *privateImage) Trim(off, n int64) {}

func (p *privateImage) bytes() (ram, spilled int64) { return 0, 0 }

// baseOnly is false: a private image is its own file.
func (p *privateImage) baseOnly(off, n int64) bool { return false }

// source is data: block status reads a private image's own file.
func (p *privateImage) source(blk int64) blockSource { return fromCacheData }

// unheld is 0: a private image is a whole disk already, outside the
// write-cache quota.
func (p *privateImage) unheld(off, n int64, zeroes bool) int64 { return 0 }

// close releases the writer lock; the image stays for the next boot.
func (p *privateImage) close() {
	p.f.Close()
	p.lock.Close()
}

// privateDir holds the clients' private images of vd.
func (vd *vdisk) privateDir() string { return filepath.Join(vd.store, "private", vd.name) }

// privatePath is where client's private image of vd lives.
func (vd *vdisk) privatePath(client string) string {
	return filepath.Join(vd.privateDir(), client+".img")
}
