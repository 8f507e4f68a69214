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
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
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
