package cli

import (
	"context"
	"errors"
)

func runAgent(ctx context.Context, stdio Stdio, args []string) error {
	return errors.New("agent: not built yet")
}
