// Command mkdeb builds deskway's Debian package from deploy/nfpm.yaml
// with nfpm, the packager GoReleaser uses, so that no Debian packaging
// tool chain is needed to make it:
//
//	go run ./tools/mkdeb -bin bin -version 0.1.0 -out bin/deskway_0.1.0_amd64.deb
//
// Run it from the repository's top directory: the paths in the nfpm file
// are relative to it.
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/goreleaser/nfpm/v2"
	"github.com/goreleaser/nfpm/v2/deb"
	"go.yaml.in/yaml/v3"
)

func main() {
	bin := flag.String("bin", "bin", "the directory holding deskway and deskway-nbdroot")
	version := flag.String("version", "0.0.0", "the package's version")
	out := flag.String("out", "", "the .deb to write (default: BIN/deskway_VERSION_amd64.deb)")
	conf := flag.String("config", "deploy/nfpm.yaml", "the nfpm configuration")
	flag.Parse()
	if *out == "" {
		*out = filepath.Join(*bin, fmt.Sprintf("deskway_%s_amd64.deb", *version))
	}
	abs, err := filepath.Abs(*bin)
	if err != nil {
		log.Fatal(err)
	}
	env := map[string]string{"DESKWAY_BIN": abs, "DESKWAY_VERSION": *version}
	cfg, err := nfpm.ParseFileWithEnvMapping(*conf, func(k string) string { return env[k] })
	if err != nil {
		log.Fatalf("mkdeb: %s: %v", *conf, err)
	}
	info, err := cfg.Get("deb")
	if err != nil {
		log.Fatalf("mkdeb: %v", err)
	}
	// The changelog Debian policy asks for (/usr/share/doc/deskway/
	// changelog.Debian.gz): one entry, for the version being built.
	chg, err := os.CreateTemp("", "deskway-changelog-*.yml")
	if err != nil {
		log.Fatal(err)
	}
	defer os.Remove(chg.Name())
	if err := writeChangelog(chg, *version, info.Maintainer); err != nil {
		log.Fatalf("mkdeb: changelog: %v", err)
	}
	info.Changelog = chg.Name()
	info = nfpm.WithDefaults(info)
	if err := nfpm.PrepareForPackager(info, "deb"); err != nil {
		log.Fatalf("mkdeb: %v", err)
	}
	f, err := os.Create(*out + ".tmp")
	if err != nil {
		log.Fatal(err)
	}
	if err := deb.Default.Package(info, f); err != nil {
		f.Close()
		os.Remove(f.Name())
		log.Fatalf("mkdeb: %v", err)
	}
	if err := f.Close(); err != nil {
		log.Fatal(err)
	}
	if err := os.Rename(f.Name(), *out); err != nil {
		log.Fatal(err)
	}
	fmt.Println(*out)
}

// writeChangelog writes a chglog file (the format nfpm turns into
// changelog.Debian.gz) with one entry for version, dated SOURCE_DATE_EPOCH
// when it is set (a reproducible build) or now, and closes f.
func writeChangelog(f *os.File, version, maintainer string) error {
	when := time.Now().UTC()
	if e := os.Getenv("SOURCE_DATE_EPOCH"); e != "" {
		sec, err := strconv.ParseInt(e, 10, 64)
		if err != nil {
			f.Close()
			return fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", e, err)
		}
		when = time.Unix(sec, 0).UTC()
	}
	entries := []map[string]any{{
		"semver":   version,
		"date":     when,
		"packager": maintainer,
		"deb":      map[string]any{"urgency": "medium", "distributions": []string{"unstable"}},
		"changes":  []map[string]string{{"note": "deskway " + version + ", built from its source tree with make deb."}},
	}}
	err := yaml.NewEncoder(f).Encode(entries)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
