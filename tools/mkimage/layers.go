package main

import (
	"archive/tar"
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"slices"
	"strings"
	"time"
)

// epoch is every entry's modification time: the same inputs give the
// same layers, whatever day they are built.
var epoch = time.Unix(0, 0)

// layer writes one layer's tar, adding each missing parent directory
// (root's, 0755) before the first entry beneath it.
type layer struct {
	buf  bytes.Buffer
	tw   *tar.Writer
	dirs map[string]bool
}

func newLayer() *layer {
	l := &layer{dirs: map[string]bool{}}
	l.tw = tar.NewWriter(&l.buf)
	return l
}

// parents writes the directories above name that this layer lacks.
func (l *layer) parents(name string) error {
	dir := path.Dir(strings.TrimSuffix(name, "/"))
	if dir == "." || l.dirs[dir] {
		return nil
	}
	return l.dir(dir, 0o755, 0)
}

func (l *layer) dir(name string, mode int64, owner int) error {
	if err := l.parents(name); err != nil {
		return err
	}
	l.dirs[strings.TrimSuffix(name, "/")] = true
	return l.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimSuffix(name, "/") + "/",
		Mode: mode, Uid: owner, Gid: owner, ModTime: epoch})
}

func (l *layer) file(name string, mode int64, body []byte) error {
	if err := l.parents(name); err != nil {
		return err
	}
	if err := l.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(body)), ModTime: epoch}); err != nil {
		return err
	}
	_, err := l.tw.Write(body)
	return err
}

func (l *layer) symlink(name, target string) error {
	if err := l.parents(name); err != nil {
		return err
	}
	return l.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777, ModTime: epoch})
}

func (l *layer) bytes() ([]byte, error) {
	if err := l.tw.Close(); err != nil {
		return nil, err
	}
	return l.buf.Bytes(), nil
}

// baseLayer holds the user's passwd and group entries and the
// directories it needs: its state directory, and a /tmp anyone may
// write to, as on any Debian system.
func baseLayer() ([]byte, error) {
	l := newLayer()
	for _, step := range []func() error{
		func() error { return l.dir("etc/deskway", 0o755, 0) },
		func() error { return l.dir("var/lib/deskway", 0o755, uid) },
		func() error { return l.dir("tmp", 0o1777, 0) },
		func() error {
			return l.file("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/sbin/nologin\ndeskway:x:65532:65532:deskway:/var/lib/deskway:/sbin/nologin\n"))
		},
		func() error { return l.file("etc/group", 0o644, []byte("root:x:0:\ndeskway:x:65532:\n")) },
	} {
		if err := step(); err != nil {
			return nil, fmt.Errorf("base layer: %w", err)
		}
	}
	return l.bytes()
}

// binaryLayer holds deskway itself, the layer that changes most often,
// so it comes last.
func binaryLayer(exe []byte) ([]byte, error) {
	l := newLayer()
	if err := l.file("usr/bin/deskway", 0o755, exe); err != nil {
		return nil, fmt.Errorf("binary layer: %w", err)
	}
	return l.bytes()
}

// debPackage is a Debian package installed on the build machine.
type debPackage struct {
	name, version string
	files         []string // absolute paths, as dpkg lists them
}

// installed asks dpkg for an installed package's version and files.
func installed(name string) (debPackage, error) {
	v, err := exec.Command("dpkg-query", "-W", "-f=${Version}", name).Output()
	if err != nil {
		return debPackage{}, fmt.Errorf("the Debian package %s is not installed on this machine (apt-get install %s): %w", name, name, err)
	}
	list, err := exec.Command("dpkg-query", "-L", name).Output()
	if err != nil {
		return debPackage{}, fmt.Errorf("listing the files of %s: %w", name, err)
	}
	return debPackage{name: name, version: string(v), files: strings.Split(strings.TrimSpace(string(list)), "\n")}, nil
}

// under returns the package's paths below dir, sorted.
func (p debPackage) under(dir string) []string {
	var out []string
	for _, f := range p.files {
		if strings.HasPrefix(f, dir+"/") {
			out = append(out, f)
		}
	}
	slices.Sort(out)
	return out
}

// copyright writes the package's copyright file, which its licence
// asks to travel with it.
func (l *layer) copyright(p debPackage) error {
	name := "/usr/share/doc/" + p.name + "/copyright"
	body, err := os.ReadFile(name)
	if err != nil {
		return fmt.Errorf("%s: %w", p.name, err)
	}
	return l.file(name[1:], 0o644, body)
}

// tzdataLayer holds /usr/share/zoneinfo as the tzdata package installed
// it, so that TZ=Area/City works.
func tzdataLayer(p debPackage) ([]byte, error) {
	l := newLayer()
	for _, f := range p.under("/usr/share/zoneinfo") {
		fi, err := os.Lstat(f)
		if err != nil {
			return nil, fmt.Errorf("tzdata lists %s, which is not on this machine (reinstall tzdata): %w", f, err)
		}
		switch {
		case fi.IsDir():
			err = l.dir(f[1:], 0o755, 0)
		case fi.Mode()&fs.ModeSymlink != 0:
			var target string
			if target, err = os.Readlink(f); err == nil {
				err = l.symlink(f[1:], target)
			}
		default:
			var body []byte
			if body, err = os.ReadFile(f); err == nil {
				err = l.file(f[1:], 0o644, body)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("tzdata: %w", err)
		}
	}
	if err := l.copyright(p); err != nil {
		return nil, err
	}
	return l.bytes()
}

// caLayer holds /etc/ssl/certs/ca-certificates.crt, made as
// update-ca-certificates makes it from the ca-certificates package's
// own certificates (each, in order of name, ending with a new line), then
// the extra PEM certificates. The build machine's bundle is not copied:
// it also holds whatever its administrator added in
// /usr/local/share/ca-certificates.
func caLayer(p debPackage, extra [][]byte) ([]byte, error) {
	var bundle []byte
	for _, f := range p.under("/usr/share/ca-certificates") {
		if !strings.HasSuffix(f, ".crt") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("ca-certificates: %w", err)
		}
		bundle = appendLine(bundle, b)
	}
	if len(bundle) == 0 {
		return nil, fmt.Errorf("the ca-certificates package lists no certificates")
	}
	for _, b := range extra {
		bundle = appendLine(bundle, b)
	}
	l := newLayer()
	if err := l.file("etc/ssl/certs/ca-certificates.crt", 0o644, bundle); err != nil {
		return nil, fmt.Errorf("ca-certificates: %w", err)
	}
	if err := l.copyright(p); err != nil {
		return nil, err
	}
	return l.bytes()
}

func appendLine(dst, b []byte) []byte {
	dst = append(dst, b...)
	if len(b) > 0 && b[len(b)-1] != '\n' {
		dst = append(dst, '\n')
	}
	return dst
}

// readCerts reads a PEM file whose blocks must all be certificates
// (text around them, as in bundles with comments, is let be), so that a
// wrong file is refused here rather than ignored by every TLS client in
// the image.
func readCerts(name string) ([]byte, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	n := 0
	for rest := b; ; {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("%s: a %s block, not a certificate", name, blk.Type)
		}
		if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("%s: no certificate", name)
	}
	return b, nil
}
