package initramfs

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cavaliergopher/cpio"
	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"

	"github.com/deskway/deskway/internal/testkit"
)

// modulesDir is Debian's kernel that scripts/install-deps.sh unpacks,
// with the modules of ext4, virtio, NBD and virtio-net kept.
func modulesDir(t *testing.T) string {
	t.Helper()
	dirs, _ := filepath.Glob(filepath.Join(testkit.KernelDir, "lib", "modules", "*"))
	if len(dirs) == 0 {
		if os.Getenv("CI") != "" {
			t.Fatalf("no kernel modules in %s: scripts/install-deps.sh unpacks them", testkit.KernelDir)
		}
		t.Skip("no kernel modules: run scripts/install-deps.sh")
	}
	return dirs[0]
}

// TestResolveOrdersDependenciesFirst: every module comes after what its
// .modinfo says it depends on (depends=, and softdep=pre: through an
// alias: ext4 names "crc32c", which crc32c_generic provides), a missing
// optional module is left out, and a missing required one is an error
// that names it.
func TestResolveOrdersDependenciesFirst(t *testing.T) {
	dir := modulesDir(t)
	mods, err := Resolve(dir, []string{"nbd", "ext4"}, []string{"virtio_pci", "virtio-net", "e1000e"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range mods {
		names = append(names, m.Name)
		if !strings.HasSuffix(m.Path, ".ko") {
			t.Errorf("%s: path %s", m.Name, m.Path)
		}
	}
	at := func(n string) int {
		i := slices.Index(names, n)
		if i < 0 {
			t.Fatalf("%s is not in %v", n, names)
		}
		return i
	}
	for _, before := range [][2]string{{"jbd2", "ext4"}, {"mbcache", "ext4"}, {"crc16", "ext4"}, {"crc32c_generic", "ext4"},
		{"virtio_ring", "virtio_net"}, {"virtio", "virtio_net"}, {"net_failover", "virtio_net"}, {"failover", "net_failover"},
		{"virtio_pci_modern_dev", "virtio_pci"}} {
		if at(before[0]) > at(before[1]) {
			t.Errorf("%s loads after %s: %v", before[0], before[1], names)
		}
	}
	if slices.Contains(names, "e1000e") || len(names) != len(slices.Compact(slices.Clone(names))) {
		t.Errorf("a missing optional module listed, or one listed twice: %v", names)
	}
	if _, err := Resolve(dir, []string{"ext4", "no_such_module"}, nil); err == nil || !strings.Contains(err.Error(), "no module no_such_module") {
		t.Errorf("a missing required module: %v", err)
	}
}

// TestBuildWritesWhatTheKernelUnpacks reads the archive back: the
// directories before their files, /init executable and naming the root
// file system, every module the order file lists present, and the
// machine's card found by BOOTIF.
func TestBuildWritesWhatTheKernelUnpacks(t *testing.T) {
	dir := modulesDir(t)
	testkit.Require(t, "busybox")
	bb, _ := exec.LookPath("busybox")
	var buf bytes.Buffer
	mods, err := Build(&buf, Options{Modules: dir, Busybox: bb, Nbdroot: bb, FSType: "ext4"})
	if err != nil {
		t.Fatal(err)
	}
	r := cpio.NewReader(&buf)
	seen := map[string]cpio.FileMode{}
	files := map[string][]byte{}
	for {
		h, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if d := filepath.Dir(h.Name); d != "." && !seen[d].IsDir() {
			t.Errorf("%s comes before its directory %s", h.Name, d)
		}
		seen[h.Name] = h.Mode
		b, _ := io.ReadAll(r)
		files[h.Name] = b
	}
	if seen["init"]&0o111 == 0 || !bytes.Contains(files["init"], []byte("mount -t ext4 /dev/nbd0 /newroot")) || !bytes.Contains(files["init"], []byte("BOOTIF=01-")) {
		t.Errorf("init %v:\n%s", seen["init"], files["init"])
	}
	order := strings.Fields(string(files["modules/order"]))
	if len(order) != len(mods) || !slices.Contains(order, "nbd") || !slices.Contains(order, "virtio_net") {
		t.Errorf("modules/order %v, modules %v", order, mods)
	}
	for _, m := range order {
		if len(files["modules/"+m+".ko"]) == 0 {
			t.Errorf("modules/%s.ko is missing", m)
		}
	}
	for _, d := range []string{"dev", "proc", "sys", "newroot", "bin"} {
		if !seen[d].IsDir() {
			t.Errorf("no directory %s", d)
		}
	}
	// A dynamically linked program would not run in an initramfs, and a
	// kernel with no card driver it knows would boot with no network.
	if _, err := Build(io.Discard, Options{Modules: dir, Busybox: "/bin/sh", Nbdroot: bb}); err == nil || !strings.Contains(err.Error(), "dynamically linked") {
		t.Errorf("a dynamic busybox: %v", err)
	}
	empty := t.TempDir()
	os.MkdirAll(filepath.Join(empty, "kernel"), 0o755)
	if _, err := Build(io.Discard, Options{Modules: empty, Busybox: bb, Nbdroot: bb}); err == nil || !strings.Contains(err.Error(), "no module nbd") {
		t.Errorf("a tree without nbd: %v", err)
	}
}

// TestCompressedModulesAndOptionalGaps: modules compressed as Fedora's
// (xz) and Ubuntu's (zstd) kernels ship them are found, read and put in
// the archive plain; an optional driver whose dependency is missing is
// left out instead of failing the build.
func TestCompressedModulesAndOptionalGaps(t *testing.T) {
	dir := modulesDir(t)
	tree := t.TempDir()
	find := func(name string) string {
		mods, err := Resolve(dir, []string{name}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return mods[len(mods)-1].Path
	}
	plain := map[string][]byte{}
	for name, ext := range map[string]string{"nbd": ".ko.xz", "virtio_net": ".ko.zst"} {
		b, err := os.ReadFile(find(name))
		if err != nil {
			t.Fatal(err)
		}
		plain[name] = b
		var z bytes.Buffer
		if ext == ".ko.xz" {
			w, _ := xz.NewWriter(&z)
			w.Write(b)
			w.Close()
		} else {
			w, _ := zstd.NewWriter(&z)
			w.Write(b)
			w.Close()
		}
		os.MkdirAll(filepath.Join(tree, "kernel", "drivers"), 0o755)
		os.WriteFile(filepath.Join(tree, "kernel", "drivers", name+ext), z.Bytes(), 0o644)
	}
	// virtio_net's dependencies (net_failover, virtio) are not in tree.
	mods, err := Resolve(tree, []string{"nbd"}, []string{"virtio_net"})
	if err != nil || len(mods) != 1 || mods[0].Name != "nbd" {
		t.Fatalf("Resolve: %v %v", mods, err)
	}
	b, err := ReadModule(mods[0].Path)
	if err != nil || !bytes.Equal(b, plain["nbd"]) {
		t.Fatalf("nbd.ko.xz read back: %d bytes (%v), want the %d plain ones", len(b), err, len(plain["nbd"]))
	}
	var buf bytes.Buffer
	if err := Write(&buf, ModuleFiles(mods)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(buf.Bytes(), plain["nbd"][:4096]) {
		t.Error("the archive does not hold nbd.ko decompressed")
	}
	if b, err := ReadModule(filepath.Join(tree, "kernel", "drivers", "virtio_net.ko.zst")); err != nil || !bytes.Equal(b, plain["virtio_net"]) {
		t.Errorf("virtio_net.ko.zst read back: %v", err)
	}
}
