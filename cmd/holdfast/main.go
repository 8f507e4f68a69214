// Command holdfast is the coordination server and its command line.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/holdfast/holdfast/internal/cli"
)

func main() {
	// A hang-up (the terminal or ssh session closed) is a shutdown too:
	// unhandled it would kill the process at once, with no clean stop of
	// an agent and, for "holdfast lock", a child left running in its own
	// process group while the lock it ran under is abandoned.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	err := cli.Run(ctx, os.Args[1:], cli.Stdio{In: os.Stdin, Out: os.Stdout, Err: os.Stderr, Getenv: os.Getenv})
	stop()
	if err != nil {
		var ee *cli.ExitError
		if !errors.As(err, &ee) || !ee.Silent {
			fmt.Fprintln(os.Stderr, err.Error())
		}
		os.Exit(cli.ExitCode(err))
	}
}
