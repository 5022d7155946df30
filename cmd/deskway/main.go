// Command deskway is the remote-desktop delivery platform: one binary with
// a subcommand per role.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/deskway/deskway/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
