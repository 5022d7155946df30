// Command deskway-nbdroot runs in the initramfs of a machine that
// network-boots from deskway: it connects the root disk that the kernel
// command line names (deskway.export, deskway.servers) to the kernel's
// NBD driver and keeps it connected. It is a program of its own, not a
// deskway subcommand, so that the initramfs carries a few MiB rather than
// the whole server.
//
//	deskway-nbdroot [/dev/nbd0]
package main

import (
	"context"
	"log"
	"os"

	"golang.org/x/sys/unix"

	"github.com/deskway/deskway/internal/nbdroot"
)

func main() {
	dev := "/dev/nbd0"
	if len(os.Args) > 1 {
		dev = os.Args[1]
	}
	l := log.New(os.Stderr, "", 0)
	// The machine's disk stalls for good if this process is gone: keep it
	// out of the OOM killer's reach and its pages out of swap (which may
	// be on that very disk).
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte("-1000"), 0); err != nil {
		l.Printf("deskway: oom_score_adj: %v", err)
	}
	if err := unix.Mlockall(unix.MCL_CURRENT | unix.MCL_FUTURE); err != nil {
		l.Printf("deskway: mlockall: %v", err)
	}
	cmdline, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		l.Fatalf("deskway: %v", err)
	}
	if err := nbdroot.Run(context.Background(), string(cmdline), dev, l); err != nil {
		l.Fatalf("deskway: %v", err)
	}
}
