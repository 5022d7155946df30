# deskway: `make run` starts every role with embedded defaults and, as
# root, makes this machine the demo's session host (xrdp on loopback, the
# deskway-demo account with twm and an xterm; it prints each step);
# `make test` installs what the tests need and runs all of them.
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)
GO ?= go
STATE_DIR ?= /var/lib/deskway
# A count, not a duration: a duration races the fuzz coordinator's own
# deadline in go1.26 (golang/go#75804) and fails with no crasher. Each
# run adds its new inputs to the corpus cache the next run starts from;
# the few targets whose inputs cost milliseconds (FuzzConn, the gateway's
# and the site's) spend most of the step's time on them, so the count is
# that of a short run for those: 10,000 inputs.
FUZZTIME ?= 10000x

# What `deskway version`, the start log line and deskway_build_info say;
# every binary the targets below build is stamped with it.
VERSION ?= 0.1.0+git$(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
stamp = -X github.com/deskway/deskway/internal/cli.Version=$(1) -X github.com/deskway/deskway/internal/cli.Revision=$(REVISION)
GO_LDFLAGS = $(call stamp,$(VERSION))

.PHONY: all build run deps assets deb image test unit e2e fuzz lint clean

all: build

build: assets
	$(GO) build -ldflags "$(GO_LDFLAGS)" -o bin/deskway ./cmd/deskway
	# The root-disk helper a network-booted machine's initramfs runs: static.
	CGO_ENABLED=0 $(GO) build -ldflags="-s -w" -o bin/deskway-nbdroot ./cmd/deskway-nbdroot

# The browser RDP client (npm packages pinned in web/package-lock.json),
# embedded in the binary; without it the portal offers no "open in browser".
assets:
	scripts/web-assets.sh

# The Debian package (deploy/nfpm.yaml): the binaries, a systemd unit per
# role and one for every role of the config, /etc/deskway/deskway.yaml.
# Its binary says the package's version and is stripped (-s -w).
DEB_VERSION ?= $(VERSION)
deb: GO_LDFLAGS = -s -w $(call stamp,$(DEB_VERSION))
deb: build
	rm -f bin/deskway_*_amd64.deb
	$(GO) run ./tools/mkdeb -bin bin -version $(DEB_VERSION)

# The container image (tools/mkimage): the static binary in an image of
# its own, with no base image; podman load -i bin/deskway-image.tar.
IMAGE_TAG ?= $(subst +,-,$(DEB_VERSION))
image: assets
	CGO_ENABLED=0 $(GO) build -ldflags "$(GO_LDFLAGS)" -o bin/deskway-static ./cmd/deskway
	$(GO) run ./tools/mkimage -bin bin/deskway-static -tag deskway:$(IMAGE_TAG) -version $(DEB_VERSION) -out bin/deskway-image.tar

run: build
	./bin/deskway up --state-dir $(STATE_DIR)

deps:
	scripts/install-deps.sh

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	$(GO) vet ./...
	$(GO) run ./tools/archcheck

# Every test: unit, loopback integration and real-peer e2e tests, and
# short fuzzing (scripts/test.sh: the e2e package beside the others,
# which run with -race and then the fuzz targets; its tests that boot
# guests, and its two chains of xrdp cases, in processes of their own),
# ending with the ten slowest tests, the wall time and the line "N
# passed, N failed, N skipped".
#
# TEST_PARALLEL is how many tests that call t.Parallel() run at once in
# a package; in e2e it is how many work slots its parallel tests share
# (e2e/main_test.go says which e2e tests are parallel, and how those that
# share something of the machine take turns), with TestXRDP and
# TestXRDPBeside, the longest (each its cases one after another, on an
# xrdp setup of its own), in a process of their own from the start, on
# no slot (e2e/slots_test.go). The e2e tests mostly wait on protocol
# timers and their servers (the site tests spend about a fifth of their
# wall time on CPU, the fault tests that judge no timing about a tenth,
# the xrdp cases a seventh to a quarter) or boot emulated guests, which
# take a core each and share two guest slots machine-wide (a test
# booting two at once takes both) and no work slot: the guest slots, not
# this number, keep emulated guests to the two cores, and the three work
# slots keep the tests that boot none going beside them. Tests that hold
# a time budget run one at a time, before the other e2e tests (beside
# the guest tests and the xrdp chains, which scripts/test.sh starts at
# once).
TEST_PARALLEL ?= 3
test: deps assets lint
	GO=$(GO) TEST_PARALLEL=$(TEST_PARALLEL) scripts/test.sh

unit:
	$(GO) test -race -count=1 $$($(GO) list ./... | grep -v /e2e)

e2e: deps assets
	$(GO) test -count=1 -parallel $(TEST_PARALLEL) -v ./e2e/

# Short coverage-guided runs of every fuzz target, seeded from testdata
# (scripts/fuzz.sh says how): each runs FUZZTIME inputs, and a crash
# fails the step.
fuzz:
	GO=$(GO) FUZZTIME=$(FUZZTIME) scripts/fuzz.sh

clean:
	rm -rf bin e2e/artifacts
