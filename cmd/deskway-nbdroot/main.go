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

	"github.com/deskway/deskway/internal/nbdroot"
)

func main() {
	dev := "/dev/nbd0"
	if len(os.Args) > 1 {
		dev = os.Args[1]
	}
	l := log.New(os.Stderr, "", 0)
	cmdline, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		l.Fatalf("deskway: %v", err)
	}
	if err := nbdroot.Run(context.Background(), string(cmdline), dev, l); err != nil {
		l.Fatalf("deskway: %v", err)
	}
}
