package cli

import (
	"bytes"
	"context"
	"encoding/base64"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/holdfast/holdfast/api"
)

// The kv commands replay `consul kv`: same flags, same messages, same exit
// codes, so transcripts written for consul run unchanged with holdfast.

var kvCommands = map[string]subcommand{
	"put":    {"Sets or updates data in the KV store", runKVPut},
	"get":    {"Retrieves or lists data from the KV store", runKVGet},
	"delete": {"Removes data from the KV store", runKVDelete},
}

func runKV(ctx context.Context, stdio Stdio, args []string) error {
	return dispatch(ctx, stdio, "kv", kvCommands, args)
}

const kvPutUsage = `
Usage: holdfast kv put [options] KEY [DATA]

  Writes DATA to KEY in the key/value store. DATA may be given as an
  argument, read from a file with @path, or read from stdin with "-".
  Without DATA the key is written with an empty value.

      $ holdfast kv put config/redis/maxconns 5
      $ holdfast kv put config/program/license @license.lic
      $ echo "abcd1234" | holdfast kv put config/program/license -

  With -cas the write happens only if the key's ModifyIndex still equals
  -modify-index (0: only if the key does not exist). With -acquire or
  -release and -session, the write also locks or unlocks the key.
`

func runKVPut(ctx context.Context, stdio Stdio, args []string) error {
	fs := newFlagSet(stdio, "kv put", kvPutUsage)
	var hf httpFlags
	hf.register(fs)
	cas := fs.Bool("cas", false, "Perform a check-and-set: write only if the key's ModifyIndex equals -modify-index.")
	kvFlags := fs.Uint64("flags", 0, "Unsigned integer to store with the key; holdfast does not interpret it.")
	b64 := fs.Bool("base64", false, "Treat DATA as base64-encoded.")
	modifyIndex := fs.Uint64("modify-index", 0, "ModifyIndex the key must have for -cas (0: the key must not exist).")
	session := fs.String("session", "", "Session ID for -acquire and -release; ignored by a plain put.")
	acquire := fs.Bool("acquire", false, "Lock the key for -session, creating it if needed.")
	release := fs.Bool("release", false, "Unlock the key held by -session.")
	if done, err := parseFlags(fs, args); done {
		return err
	}

	key, data, err := putData(stdio, fs.Args())
	if err != nil {
		return fail(stdio, "Error! "+err.Error())
	}
	value := []byte(data)
	if *b64 {
		// consul prints this error and writes anyway; holdfast stops.
		if value, err = base64.StdEncoding.DecodeString(data); err != nil {
			return fail(stdio, fmt.Sprintf("Error! Cannot base 64 decode data: %s", err))
		}
	}
	if n := countTrue(*cas, *acquire, *release); n > 1 {
		// Consul's CLI quietly does one of them; the HTTP API refuses
		// the same request with "Conflicting flags".
		return fail(stdio, "Error! Conflicting flags: use at most one of -cas, -acquire and -release")
	}
	if (*acquire || *release) && *session == "" {
		return fail(stdio, "Error! Missing -session (required with -acquire and -release)")
	}
	client, err := hf.client(stdio)
	if err != nil {
		return connectError(stdio, err)
	}

	kv := client.KV()
	pair := &api.KVPair{Key: key, ModifyIndex: *modifyIndex, Flags: *kvFlags, Value: value, Session: *session}
	switch {
	case *cas:
		ok, _, err := kv.CAS(ctx, pair, nil)
		if err != nil {
			return fail(stdio, fmt.Sprintf("Error! Did not write to %s: %s", key, err))
		}
		if !ok && *modifyIndex == 0 {
			return fail(stdio, fmt.Sprintf("Error! Did not write to %s: CAS performed with index=0 and key already exists.", key))
		}
		if !ok {
			return fail(stdio, fmt.Sprintf("Error! Did not write to %s: CAS failed", key))
		}
		say(stdio, "Success! Data written to: "+key)
	case *acquire:
		ok, _, err := kv.Acquire(ctx, pair, nil)
		if err != nil {
			return fail(stdio, fmt.Sprintf("Error! Failed writing data: %s", err))
		}
		if !ok {
			return fail(stdio, "Error! Did not acquire lock")
		}
		say(stdio, "Success! Lock acquired on: "+key)
	case *release:
		ok, _, err := kv.Release(ctx, pair, nil)
		if err != nil {
			// consul prints the key here, not the error; so do we.
			return fail(stdio, fmt.Sprintf("Error! Failed writing data: %s", key))
		}
		if !ok {
			return fail(stdio, "Error! Did not release lock")
		}
		say(stdio, "Success! Lock released on: "+key)
	default:
		if _, err := kv.Put(ctx, pair, nil); err != nil {
			return fail(stdio, fmt.Sprintf("Error! Failed writing data: %s", err))
		}
		say(stdio, "Success! Data written to: "+key)
	}
	return nil
}

// putData splits the arguments of kv put into the key and the data, reading
// the data from a file (@path) or stdin ("-") when asked to. A DATA that
// merely starts with "-" ("-5") is taken literally.
func putData(stdio Stdio, args []string) (key, data string, err error) {
	switch len(args) {
	case 0:
		return "", "", fmt.Errorf("Missing KEY argument")
	case 1:
		return args[0], "", nil
	case 2:
	default:
		return "", "", fmt.Errorf("Too many arguments (expected 1 or 2, got %d)", len(args))
	}
	key, data = args[0], args[1]
	switch {
	case data == "":
		return key, "", nil
	case data[0] == '@':
		b, err := os.ReadFile(data[1:])
		if err != nil {
			return "", "", fmt.Errorf("Failed to read file: %s", err)
		}
		return key, string(b), nil
	case data == "-":
		if stdio.In == nil {
			return key, "", nil
		}
		b, err := io.ReadAll(stdio.In)
		if err != nil {
			return "", "", fmt.Errorf("Failed to read stdin: %s", err)
		}
		return key, string(b), nil
	}
	return key, data, nil
}

const kvGetUsage = `
Usage: holdfast kv get [options] [KEY_OR_PREFIX]

  Prints the value stored at KEY. A missing key is an error; a key with an
  empty value prints an empty line.

      $ holdfast kv get redis/config/minconns
      $ holdfast kv get -detailed redis/config/minconns

  With -recurse, prints every key under the prefix as key:value; with
  -keys, prints only the key names, rolled up at -separator.

      $ holdfast kv get -recurse redis/
      $ holdfast kv get -keys redis/
`

func runKVGet(ctx context.Context, stdio Stdio, args []string) error {
	fs := newFlagSet(stdio, "kv get", kvGetUsage)
	var hf httpFlags
	hf.register(fs)
	b64 := fs.Bool("base64", false, "Print values base64-encoded.")
	detailed := fs.Bool("detailed", false, "Print the key's metadata (indexes, flags, session) as well as its value.")
	keys := fs.Bool("keys", false, "List the keys under the prefix without their values.")
	recurse := fs.Bool("recurse", false, "Print every key under the prefix.")
	separator := fs.String("separator", "/", "Separator at which -keys rolls up key names.")
	if done, err := parseFlags(fs, args); done {
		return err
	}

	key, err := keyArg(stdio, fs)
	if err != nil {
		return err
	}
	if key == "" && !(*recurse || *keys) {
		return fail(stdio, "Error! Missing KEY argument")
	}
	client, err := hf.client(stdio)
	if err != nil {
		return connectError(stdio, err)
	}
	kv := client.KV()
	q := &api.QueryOptions{AllowStale: hf.stale}
	queryFailed := func(err error) error {
		return fail(stdio, fmt.Sprintf("Error querying Consul agent: %s", err))
	}

	switch {
	case *keys && *recurse:
		pairs, _, err := kv.List(ctx, key, q)
		if err != nil {
			return queryFailed(err)
		}
		for i, p := range pairs {
			if !*detailed {
				say(stdio, p.Key)
				continue
			}
			say(stdio, detailedPair(p, false, true))
			if i < len(pairs)-1 {
				say(stdio, "")
			}
		}
	case *keys:
		names, _, err := kv.Keys(ctx, key, *separator, q)
		if err != nil {
			return queryFailed(err)
		}
		for _, n := range names {
			say(stdio, n)
		}
	case *recurse:
		pairs, _, err := kv.List(ctx, key, q)
		if err != nil {
			return queryFailed(err)
		}
		for i, p := range pairs {
			if *detailed {
				say(stdio, detailedPair(p, *b64, false))
				if i < len(pairs)-1 {
					say(stdio, "")
				}
				continue
			}
			say(stdio, p.Key+":"+valueText(p.Value, *b64))
		}
	default:
		p, _, err := kv.Get(ctx, key, q)
		if err != nil {
			return queryFailed(err)
		}
		if p == nil {
			return fail(stdio, "Error! No key exists at: "+key)
		}
		if *detailed {
			say(stdio, detailedPair(p, *b64, false))
		} else {
			say(stdio, valueText(p.Value, *b64))
		}
	}
	return nil
}

func valueText(v []byte, b64 bool) string {
	if b64 {
		return base64.StdEncoding.EncodeToString(v)
	}
	return string(v)
}

// detailedPair renders p the way `consul kv get -detailed` does: one
// "Name<pad>value" line per field in alphabetical order, values starting
// in column 18, Session "-" when unlocked. The Value line (left out when
// keysOnly) carries no newline of its own; the caller's line adds it.
// With keysOnly the text ends in a newline, so printing it as a line
// leaves a blank line after it, as consul does.
func detailedPair(p *api.KVPair, b64, keysOnly bool) string {
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 2, 6, ' ', 0)
	fmt.Fprintf(tw, "CreateIndex\t%d\n", p.CreateIndex)
	fmt.Fprintf(tw, "Flags\t%d\n", p.Flags)
	fmt.Fprintf(tw, "Key\t%s\n", p.Key)
	fmt.Fprintf(tw, "LockIndex\t%d\n", p.LockIndex)
	fmt.Fprintf(tw, "ModifyIndex\t%d\n", p.ModifyIndex)
	session := p.Session
	if session == "" {
		session = "-"
	}
	fmt.Fprintf(tw, "Session\t%s\n", session)
	if !keysOnly {
		fmt.Fprintf(tw, "Value\t%s", valueText(p.Value, b64))
	}
	tw.Flush()
	return b.String()
}

const kvDeleteUsage = `
Usage: holdfast kv delete [options] KEY_OR_PREFIX

  Removes KEY from the key/value store. Removing a key that does not exist
  succeeds. With -recurse, removes every key that starts with the prefix.
  With -cas, removes the key only if its ModifyIndex equals -modify-index.

      $ holdfast kv delete redis/config/minconns
      $ holdfast kv delete -recurse redis/
`

func runKVDelete(ctx context.Context, stdio Stdio, args []string) error {
	fs := newFlagSet(stdio, "kv delete", kvDeleteUsage)
	var hf httpFlags
	hf.register(fs)
	cas := fs.Bool("cas", false, "Delete only if the key's ModifyIndex equals -modify-index.")
	modifyIndex := fs.Uint64("modify-index", 0, "ModifyIndex the key must have for -cas.")
	recurse := fs.Bool("recurse", false, "Delete every key under the prefix.")
	if done, err := parseFlags(fs, args); done {
		return err
	}

	key, err := keyArg(stdio, fs)
	if err != nil {
		return err
	}
	if key == "" && !*recurse {
		return fail(stdio, "Error! Missing KEY argument")
	}
	if *cas && *modifyIndex == 0 {
		return fail(stdio, "Cannot delete a key that does not exist. Provide a -modify-index greater than than 0.")
	}
	if *modifyIndex != 0 && !*cas {
		return fail(stdio, "Cannot specify -modify-index without -cas!")
	}
	if *recurse && *cas {
		return fail(stdio, "Cannot specify both -cas and -recurse!")
	}
	client, err := hf.client(stdio)
	if err != nil {
		return connectError(stdio, err)
	}

	kv := client.KV()
	switch {
	case *recurse:
		if _, err := kv.DeleteTree(ctx, key, nil); err != nil {
			return fail(stdio, fmt.Sprintf("Error! Did not delete prefix %s: %s", key, err))
		}
		say(stdio, "Success! Deleted keys with prefix: "+key)
	case *cas:
		ok, _, err := kv.DeleteCAS(ctx, &api.KVPair{Key: key, ModifyIndex: *modifyIndex}, nil)
		if err != nil {
			return fail(stdio, fmt.Sprintf("Error! Did not delete key %s: %s", key, err))
		}
		if !ok {
			return fail(stdio, fmt.Sprintf("Error! Did not delete key %s: CAS failed", key))
		}
		say(stdio, "Success! Deleted key: "+key)
	default:
		if _, err := kv.Delete(ctx, key, nil); err != nil {
			return fail(stdio, fmt.Sprintf("Error deleting key %s: %s", key, err))
		}
		say(stdio, "Success! Deleted key: "+key)
	}
	return nil
}

// keyArg returns the one optional KEY argument of kv get and kv delete,
// without a leading slash ("" if none was given).
func keyArg(stdio Stdio, fs *flag.FlagSet) (string, error) {
	rest := fs.Args()
	if len(rest) > 1 {
		return "", fail(stdio, fmt.Sprintf("Too many arguments (expected 1, got %d)", len(rest)))
	}
	if len(rest) == 0 {
		return "", nil
	}
	return strings.TrimPrefix(rest[0], "/"), nil
}

// countTrue counts the true values among bs.
func countTrue(bs ...bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}
