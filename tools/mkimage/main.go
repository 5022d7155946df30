// Command mkimage builds deskway's container image from a static deskway
// binary, with no base image and no container engine or registry:
//
//	CGO_ENABLED=0 go build -o bin/deskway-static ./cmd/deskway
//	go run ./tools/mkimage -bin bin/deskway-static -tag deskway:0.1.0 -out bin/deskway-image.tar
//
// The result is an image archive that `podman load -i` and `docker load
// -i` read. Its layers: an unprivileged user (65532) the process runs
// as, its state directory and a writable /tmp; Debian's CA bundle and
// time zones, taken from the ca-certificates and tzdata packages
// installed on the build machine (their versions are in the image's
// labels); the binary. The configuration comes from a volume at
// /etc/deskway.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"log"
	"os"

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
	var extraCA [][]byte
	flag.Func("extra-ca", "a PEM file of certificates to add to the image's CA bundle (repeatable; for test images)", func(f string) error {
		b, err := readCerts(f)
		if err != nil {
			return err
		}
		extraCA = append(extraCA, b)
		return nil
	})
	flag.Parse()
	if err := build(*bin, *tag, *out, *version, extraCA); err != nil {
		log.Fatalf("mkimage: %v", err)
	}
}

func build(bin, tag, out, version string, extraCA [][]byte) error {
	exe, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	ca, err := installed("ca-certificates")
	if err != nil {
		return err
	}
	tz, err := installed("tzdata")
	if err != nil {
		return err
	}
	img := empty.Image
	for _, mk := range []func() ([]byte, error){
		baseLayer,
		func() ([]byte, error) { return caLayer(ca, extraCA) },
		func() ([]byte, error) { return tzdataLayer(tz) },
		func() ([]byte, error) { return binaryLayer(exe) },
	} {
		b, err := mk()
		if err != nil {
			return err
		}
		l, err := tarball.LayerFromReader(bytes.NewReader(b))
		if err != nil {
			return fmt.Errorf("layer: %w", err)
		}
		if img, err = mutate.AppendLayers(img, l); err != nil {
			return err
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Created = v1.Time{Time: epoch.UTC()} // reproducible: the same inputs give the same image
	cf.Config = v1.Config{
		Entrypoint: []string{"/usr/bin/deskway"},
		Cmd:        []string{"run", "-c", "/etc/deskway/deskway.yaml"},
		User:       "65532:65532",
		WorkingDir: "/var/lib/deskway",
		Env:        []string{"PATH=/usr/bin"},
		Volumes:    map[string]struct{}{"/var/lib/deskway": {}},
		Labels: map[string]string{
			"org.opencontainers.image.title":   "deskway",
			"org.opencontainers.image.version": version,
			"org.opencontainers.image.source":  "https://github.com/deskway/deskway",
			"deskway.debian.ca-certificates":   ca.version,
			"deskway.debian.tzdata":            tz.version,
		},
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	ref, err := name.NewTag(tag, name.WithDefaultRegistry("localhost"))
	if err != nil {
		return fmt.Errorf("tag %q: %w", tag, err)
	}
	if err := tarball.WriteToFile(out, ref, img); err != nil {
		return err
	}
	log.Printf("mkimage: %s written as %s (ca-certificates %s, tzdata %s)", out, ref, ca.version, tz.version)
	return nil
}
