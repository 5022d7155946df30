package stream

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestPrivateImage: the copy equals the base, keeps its holes, takes one
// writer, and writes never reach the base.
func TestPrivateImage(t *testing.T) {
	dir := t.TempDir()
	basePath := filepath.Join(dir, "base.img")
	const size = 64 << 20
	f, _ := os.Create(basePath)
	f.WriteAt(bytes.Repeat([]byte{7}, 1<<20), 0)
	f.WriteAt(bytes.Repeat([]byte{9}, 1<<20), 40<<20)
	f.Truncate(size)
	f.Close()
	base, err := os.Open(basePath)
	if err != nil {
		t.Fatal(err)
	}
	defer base.Close()
	path := filepath.Join(dir, "private", "golden", "alice.img")
	from := &image{base: base, baseFD: int(base.Fd()), size: size}
	p, err := openPrivate(path, from, true)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(path)
	want, _ := os.ReadFile(basePath)
	if !bytes.Equal(got, want) {
		t.Fatal("private copy differs from the base")
	}
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks*512 > 8<<20 {
		t.Errorf("private copy allocates %d bytes for 2 MiB of data: holes were filled", st.Blocks*512)
	}
	if _, err := openPrivate(path, from, true); !errors.Is(err, errWriterBusy) {
		t.Fatalf("second writer: %v", err)
	}
	if _, err := p.WriteAt([]byte("alice"), 100); err != nil {
		t.Fatal(err)
	}
	if err := p.WriteZeroes(40<<20, 4096); err != nil {
		t.Fatal(err)
	}
	p.close()
	p2, err := openPrivate(path, from, true)
	if err != nil {
		t.Fatal(err)
	}
	defer p2.close()
	b := make([]byte, 5)
	p2.ReadAt(b, 100)
	z := make([]byte, 4096)
	p2.ReadAt(z, 40<<20)
	if string(b) != "alice" || !bytes.Equal(z, make([]byte, 4096)) {
		t.Fatalf("after reopen: %q, zeroes %v", b, bytes.Equal(z, make([]byte, 4096)))
	}
	if now, _ := os.ReadFile(basePath); !bytes.Equal(now, want) {
		t.Fatal("base changed")
	}
}
