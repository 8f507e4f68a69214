package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"text/tabwriter"

	"github.com/holdfast/holdfast/api"
	"github.com/holdfast/holdfast/internal/server"
)

// The snapshot commands print consul snapshot's messages: a backup script
// written for consul runs with holdfast in its place (the archives differ
// inside: each server reads only its own).

var snapshotCommands = map[string]subcommand{
	"save":    {"Save a snapshot of the server's whole state to a file", runSnapshotSave},
	"restore": {"Replace the server's whole state with a saved snapshot", runSnapshotRestore},
	"inspect": {"Show what a saved snapshot holds", runSnapshotInspect},
}

func runSnapshot(ctx context.Context, stdio Stdio, args []string) error {
	return dispatch(ctx, stdio, "snapshot", snapshotCommands, args)
}

const snapshotSaveUsage = `
Usage: holdfast snapshot save [options] FILE

  Saves an atomic, point-in-time snapshot of the server's state (keys,
  sessions, locks, the catalog, prepared queries) to FILE, while the
  server runs. The file is written next to FILE first, read back and
  checked, and only then renamed to FILE.

      $ holdfast snapshot save backup.snap
      Saved and verified snapshot to index 8419
`

func runSnapshotSave(ctx context.Context, stdio Stdio, args []string) error {
	file, hf, done, err := snapshotFileArg(stdio, "save", snapshotSaveUsage, args)
	if done {
		return err
	}
	client, err := hf.client(stdio)
	if err != nil {
		return connectError(stdio, err)
	}
	rc, qm, err := client.Snapshot().Save(ctx, &api.QueryOptions{AllowStale: hf.stale})
	if err != nil {
		return fail(stdio, fmt.Sprintf("Error saving snapshot: %s", err))
	}
	defer rc.Close()
	tmp, err := os.CreateTemp(filepath.Dir(file), filepath.Base(file)+".*.part")
	if err != nil {
		return fail(stdio, fmt.Sprintf("Error creating snapshot file: %s", err))
	}
	defer os.Remove(tmp.Name()) // gone by then if renamed
	_, err = tmp.ReadFrom(rc)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fail(stdio, fmt.Sprintf("Error writing snapshot file: %s", err))
	}
	if _, err := inspectFile(tmp.Name()); err != nil {
		return fail(stdio, fmt.Sprintf("Error verifying snapshot file: %s", err))
	}
	if err := os.Rename(tmp.Name(), file); err != nil {
		return fail(stdio, fmt.Sprintf("Error renaming snapshot file: %s", err))
	}
	say(stdio, fmt.Sprintf("Saved and verified snapshot to index %d", qm.LastIndex))
	return nil
}

const snapshotRestoreUsage = `
Usage: holdfast snapshot restore [options] FILE

  Replaces the server's whole state with the snapshot in FILE, which
  holdfast snapshot save wrote: for recovery from a disaster. Keys,
  sessions and locks go back to the snapshot's; sessions get their full
  TTL from now. No key's LockIndex goes back: a key the snapshot has
  locked comes back above every LockIndex the replaced state gave.

      $ holdfast snapshot restore backup.snap
      Restored snapshot
`

func runSnapshotRestore(ctx context.Context, stdio Stdio, args []string) error {
	file, hf, done, err := snapshotFileArg(stdio, "restore", snapshotRestoreUsage, args)
	if done {
		return err
	}
	client, err := hf.client(stdio)
	if err != nil {
		return connectError(stdio, err)
	}
	f, err := os.Open(file)
	if err != nil {
		return fail(stdio, fmt.Sprintf("Error opening snapshot file: %s", err))
	}
	defer f.Close()
	if err := client.Snapshot().Restore(ctx, nil, f); err != nil {
		return fail(stdio, fmt.Sprintf("Error restoring snapshot: %s", err))
	}
	say(stdio, "Restored snapshot")
	return nil
}

const snapshotInspectUsage = `
Usage: holdfast snapshot inspect FILE

  Checks a snapshot file (its SHA-256 sums and that its state reads back)
  and prints what it holds. It needs no agent.

      $ holdfast snapshot inspect backup.snap
      ID           2-8419-1795859234748
      Size         1093
      Index        8419
      Term         2
      Version      1
      Keys         12
      Sessions     3
`

func runSnapshotInspect(ctx context.Context, stdio Stdio, args []string) error {
	file, _, done, err := snapshotFileArg(stdio, "inspect", snapshotInspectUsage, args)
	if done {
		return err
	}
	in, err := inspectFile(file)
	if err != nil {
		return fail(stdio, fmt.Sprintf("Error inspecting snapshot: %s", err))
	}
	tw := tabwriter.NewWriter(stdio.Out, 0, 8, 1, ' ', 0)
	for _, row := range [][2]string{
		{"ID", in.meta.ID},
		{"Size", strconv.FormatInt(in.meta.Size, 10)},
		{"Index", strconv.FormatUint(in.meta.Index, 10)},
		{"Term", strconv.FormatUint(in.meta.Term, 10)},
		{"Version", strconv.Itoa(in.meta.Version)},
		{"Keys", strconv.Itoa(in.keys)},
		{"Sessions", strconv.Itoa(in.sessions)},
	} {
		fmt.Fprintf(tw, "%s\t %s\n", row[0], row[1])
	}
	return tw.Flush()
}

// snapshotFileArg parses a snapshot command's flags and its one FILE.
func snapshotFileArg(stdio Stdio, verb, usage string, args []string) (string, *httpFlags, bool, error) {
	fs := newFlagSet(stdio, "snapshot "+verb, usage)
	var hf httpFlags
	hf.register(fs)
	if done, err := parseFlags(fs, args); done {
		return "", nil, true, err
	}
	switch fs.NArg() {
	case 0:
		return "", nil, true, fail(stdio, "Missing FILE argument")
	case 1:
	default:
		return "", nil, true, fail(stdio, fmt.Sprintf("Too many arguments (expected 1, got %d)", fs.NArg()))
	}
	return fs.Arg(0), &hf, false, nil
}

type inspected struct {
	meta           server.ArchiveMeta
	keys, sessions int
}

// inspectFile reads and checks the archive in file, its state included.
func inspectFile(file string) (*inspected, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	meta, st, err := server.ReadArchive(f)
	if err != nil {
		return nil, err
	}
	keys, sessions := server.CountArchiveState(st)
	return &inspected{meta: meta, keys: keys, sessions: sessions}, nil
}
