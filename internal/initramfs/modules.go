package initramfs

import (
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"
)

// Module is one kernel module file and the name the kernel knows it by.
type Module struct {
	Name string // as in lsmod: underscores, no .ko
	Path string
}

// normalize is a module name as the kernel compares them: dashes and
// underscores are the same.
func normalize(name string) string {
	return strings.ReplaceAll(strings.TrimSuffix(name, ".ko"), "-", "_")
}

// Resolve finds the modules named in required and optional under dir
// (/lib/modules/VERSION) with everything they depend on, in an order
// insmod can load them: each module after its dependencies. A module
// built into the kernel (modules.builtin) needs no file; a missing
// required module is an error, a missing optional one is left out.
// Dependencies come from each module's own .modinfo section, so a tree
// without modules.dep (a kernel package unpacked, not installed) works.
func Resolve(dir string, required, optional []string) ([]Module, error) {
	files := map[string]string{}
	err := filepath.WalkDir(filepath.Join(dir, "kernel"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		for _, ext := range moduleExts {
			if name, ok := strings.CutSuffix(filepath.Base(p), ext); ok {
				files[normalize(name)] = p
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("initramfs: kernel modules in %s: %w", dir, err)
	}
	builtin := map[string]bool{}
	if b, err := os.ReadFile(filepath.Join(dir, "modules.builtin")); err == nil {
		for _, l := range strings.Fields(string(b)) {
			builtin[normalize(filepath.Base(l))] = true
		}
	}
	var out []Module
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(name string, chain []string) error
	visit = func(name string, chain []string) error {
		switch state[name] {
		case 1:
			return fmt.Errorf("initramfs: modules depend on each other in a circle: %s", strings.Join(append(chain, name), " -> "))
		case 2:
			return nil
		}
		path, ok := files[name]
		if !ok {
			if builtin[name] {
				state[name] = 2
				return nil
			}
			return fmt.Errorf("initramfs: no module %s in %s (needed by %s)", name, dir, strings.Join(chain, " -> "))
		}
		state[name] = 1
		info, err := readModinfo(path)
		if err != nil {
			state[name] = 0
			return err
		}
		for _, d := range info.depends {
			if err := visit(d, append(chain, name)); err != nil {
				state[name] = 0 // an optional module's failure leaves it out, and no trace
				return err
			}
		}
		// Soft dependencies ("softdep=pre: crc32c", which ext4 has) name
		// a module or an alias of one, and load first when there is one.
		for _, d := range info.pre {
			if _, ok := files[normalize(d)]; ok {
				d = normalize(d)
			} else {
				d = aliased(files, d)
			}
			if d != "" && d != name && state[d] != 1 {
				if err := visit(d, append(chain, name)); err != nil {
					state[name] = 0
					return err
				}
			}
		}
		state[name] = 2
		out = append(out, Module{Name: name, Path: path})
		return nil
	}
	for _, n := range required {
		if err := visit(normalize(n), []string{"the initramfs"}); err != nil {
			return nil, err
		}
	}
	for _, n := range optional {
		n = normalize(n)
		if _, ok := files[n]; ok {
			_ = visit(n, []string{"the initramfs"}) // one that cannot load is left out
		}
	}
	return out, nil
}

// modinfo is what a module's .modinfo section says of what it needs.
type modinfo struct {
	depends []string // depends=
	pre     []string // softdep=pre: …
	aliases []string // alias=
}

// moduleExts are the module files Resolve finds: plain, and compressed
// as Fedora's (xz) and Ubuntu's (zstd) kernels ship them.
var moduleExts = []string{".ko", ".ko.xz", ".ko.zst"}

// ReadModule is a module file's contents, decompressed: busybox's insmod
// loads plain modules only.
func ReadModule(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var r io.Reader = f
	switch {
	case strings.HasSuffix(path, ".xz"):
		if r, err = xz.NewReader(f); err != nil {
			return nil, fmt.Errorf("initramfs: %s: %w", path, err)
		}
	case strings.HasSuffix(path, ".zst"):
		d, err := zstd.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("initramfs: %s: %w", path, err)
		}
		defer d.Close()
		r = d
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("initramfs: %s: %w", path, err)
	}
	return b, nil
}

// readModinfo reads a module's .modinfo section: NUL-separated key=value.
func readModinfo(path string) (modinfo, error) {
	var mi modinfo
	b, err := ReadModule(path)
	if err != nil {
		return mi, err
	}
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return mi, fmt.Errorf("initramfs: %s: %w", path, err)
	}
	sec := f.Section(".modinfo")
	if sec == nil {
		return mi, fmt.Errorf("initramfs: %s has no .modinfo: not a kernel module", path)
	}
	info, err := sec.Data()
	if err != nil {
		return mi, fmt.Errorf("initramfs: %s: %w", path, err)
	}
	for _, kv := range bytes.Split(info, []byte{0}) {
		k, v, _ := strings.Cut(string(kv), "=")
		switch k {
		case "depends":
			for _, d := range strings.Split(v, ",") {
				if d != "" {
					mi.depends = append(mi.depends, normalize(d))
				}
			}
		case "softdep":
			// "pre: a b post: c"
			pre := false
			for _, w := range strings.Fields(v) {
				switch w {
				case "pre:":
					pre = true
				case "post:":
					pre = false
				default:
					if pre {
						mi.pre = append(mi.pre, w)
					}
				}
			}
		case "alias":
			mi.aliases = append(mi.aliases, v)
		}
	}
	return mi, nil
}

// aliased is the module with alias a, or "" if none has it. It reads
// every module's .modinfo, so it is asked only for names that are not
// modules' own.
func aliased(files map[string]string, a string) string {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names) // the same choice every time
	for _, n := range names {
		mi, err := readModinfo(files[n])
		if err == nil && slices.Contains(mi.aliases, a) {
			return n
		}
	}
	return ""
}
