package cli

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"strings"

	"github.com/holdfast/holdfast/internal/gossip"
)

const keygenUsage = `
Usage: holdfast keygen

  Prints a new random 32-byte gossip key, base64-encoded, for the agents'
  -encrypt (or -encrypt-file): every agent of a pool must be given the
  same one. As consul keygen does.

      $ holdfast keygen
      pUqJrVyVRj5jsiYEkM/tFQYfWyJIv4s3XkvDwy7Cu5s=
`

func runKeygen(ctx context.Context, stdio Stdio, args []string) error {
	fs := newFlagSet(stdio, "keygen", keygenUsage)
	if done, err := parseNoArgs(stdio, fs, args); done {
		return err
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return fail(stdio, "Error reading random data: "+err.Error())
	}
	fmt.Fprintln(stdio.Out, base64.StdEncoding.EncodeToString(key))
	return nil
}

// parseGossipKey reads the gossip key from -encrypt (the key itself, as
// Consul's flag takes it) or -encrypt-file (a file holding it, which keeps
// the key out of the process list): base64 of 16, 24 or 32 bytes. nil
// when neither is given.
func parseGossipKey(encrypt, file string) ([]byte, error) {
	src := "-encrypt"
	switch {
	case encrypt != "" && file != "":
		return nil, fmt.Errorf("agent: give the gossip key with -encrypt or -encrypt-file, not both")
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("agent: reading -encrypt-file: %w", err)
		}
		encrypt, src = strings.TrimSpace(string(b)), "the key in -encrypt-file "+file
		if encrypt == "" {
			return nil, fmt.Errorf("agent: %s is empty", src)
		}
	case encrypt == "":
		return nil, nil
	}
	key, err := base64.StdEncoding.DecodeString(encrypt)
	if err != nil {
		return nil, fmt.Errorf("agent: %s is not base64 (holdfast keygen makes a key): %v", src, err)
	}
	if gossip.CheckKey(key) != nil {
		return nil, fmt.Errorf("agent: %s decodes to %d bytes; a gossip key is 16, 24 or 32 bytes (holdfast keygen makes a key of 32)", src, len(key))
	}
	return key, nil
}
