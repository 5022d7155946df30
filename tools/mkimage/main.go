// Command mkimage builds deskway's container image from a static deskway
// binary, with no base image and no container engine or registry:
//
//	CGO_ENABLED=0 go build -o bin/deskway-static ./cmd/deskway
//	go run ./tools/mkimage -bin bin/deskway-static -tag deskway:0.1.0 -out bin/deskway-image.tar
//
// The result is an image archive that `podman load -i` and `docker load
// -i` read. It holds the binary, an unprivileged user (65532) the
// process runs as, and its state directory; the configuration comes from
// a volume at /etc/deskway.
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"log"
	"os"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// uid is the unprivileged user deskway runs as in the image.
const uid = 65532

func main() {
	bin := flag.String("bin", "bin/deskway-static", "the static deskway binary")
	tag := flag.String("tag", "deskway:latest", "the image's name and tag")
	out := flag.String("out", "bin/deskway-image.tar", "the image archive to write")
	version := flag.String("version", "0.0.0", "the version the image's labels give")
	flag.Parse()
	exe, err := os.ReadFile(*bin)
	if err != nil {
		log.Fatalf("mkimage: %v", err)
	}
	l, err := tarball.LayerFromReader(bytes.NewReader(rootfs(exe)))
	if err != nil {
		log.Fatalf("mkimage: layer: %v", err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		log.Fatalf("mkimage: %v", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		log.Fatalf("mkimage: %v", err)
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Created = v1.Time{Time: time.Unix(0, 0).UTC()} // reproducible: the same binary gives the same image
	cf.Config = v1.Config{
		Entrypoint: []string{"/usr/bin/deskway"},
		Cmd:        []string{"run", "-c", "/etc/deskway/deskway.yaml"},
		User:       "65532:65532",
		WorkingDir: "/var/lib/deskway",
		Env:        []string{"PATH=/usr/bin"},
		Volumes:    map[string]struct{}{"/var/lib/deskway": {}},
		Labels: map[string]string{
			"org.opencontainers.image.title":   "deskway",
			"org.opencontainers.image.version": *version,
			"org.opencontainers.image.source":  "https://github.com/deskway/deskway",
		},
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		log.Fatalf("mkimage: %v", err)
	}
	ref, err := name.NewTag(*tag, name.WithDefaultRegistry("localhost"))
	if err != nil {
		log.Fatalf("mkimage: tag %q: %v", *tag, err)
	}
	if err := tarball.WriteToFile(*out, ref, img); err != nil {
		log.Fatalf("mkimage: %v", err)
	}
	log.Printf("mkimage: %s written as %s", *out, ref)
}

// rootfs is the image's one layer: the binary, the passwd and group
// entries of its user, and the directories it needs.
func rootfs(exe []byte) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	dir := func(path string, owner int) {
		must(tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: path, Mode: 0o755, Uid: owner, Gid: owner, ModTime: epoch}))
	}
	file := func(path string, mode int64, body []byte) {
		must(tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: path, Mode: mode, Size: int64(len(body)), ModTime: epoch}))
		_, err := tw.Write(body)
		must(err)
	}
	for _, d := range []string{"etc/", "etc/deskway/", "usr/", "usr/bin/", "var/", "var/lib/"} {
		dir(d, 0)
	}
	dir("var/lib/deskway/", uid)
	dir("tmp/", 0)
	file("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/sbin/nologin\ndeskway:x:65532:65532:deskway:/var/lib/deskway:/sbin/nologin\n"))
	file("etc/group", 0o644, []byte("root:x:0:\ndeskway:x:65532:\n"))
	file("usr/bin/deskway", 0o755, exe)
	must(tw.Close())
	return buf.Bytes()
}

func must(err error) {
	if err != nil {
		log.Fatalf("mkimage: %v", err)
	}
}
