package e2e

import (
	"bytes"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/consul/api"
)

// A backup through Consul's client (Snapshot().Save and Restore) and
// through the CLI (holdfast snapshot save, inspect, restore) of a running
// durable agent: the restore brings back the backup's keys and lock holder,
// with a LockIndex above the ones given since, and a SIGKILL after it
// finds the restored state.
func TestSnapshotSaveRestore(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a := startAgent(t, agentOpts{dataDir: dir})
	c := a.client()
	kv := c.KV()
	sid, _, err := c.Session().Create(&api.SessionEntry{Name: "backup", LockDelay: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	put := func(p *api.KVPair) {
		t.Helper()
		if _, err := kv.Put(p, nil); err != nil {
			t.Fatal(err)
		}
	}
	acquire := func(ok bool, op func(*api.KVPair, *api.WriteOptions) (bool, *api.WriteMeta, error), p *api.KVPair) {
		t.Helper()
		if got, _, err := op(p, nil); err != nil || got != ok {
			t.Fatalf("%+v: %v %v, want %v", p, got, err, ok)
		}
	}
	put(&api.KVPair{Key: "cfg/a", Value: []byte("1"), Flags: 7})
	acquire(true, kv.Acquire, &api.KVPair{Key: "svc/leader", Value: []byte("me"), Session: sid})

	rc, qm, err := c.Snapshot().Save(nil)
	if err != nil {
		t.Fatal(err)
	}
	archive, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || qm.LastIndex == 0 || len(archive) == 0 {
		t.Fatalf("Save: %d bytes, index %d, %v", len(archive), qm.LastIndex, err)
	}
	file := filepath.Join(t.TempDir(), "backup.snap")
	out, err := exec.Command(binPath, "snapshot", "save", "-http-addr", a.httpAddr, file).CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "Saved and verified snapshot to index ") {
		t.Fatalf("holdfast snapshot save: %v\n%s", err, out)
	}
	out, err = exec.Command(binPath, "snapshot", "inspect", file).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Keys") || !strings.Contains(string(out), "Sessions  1") {
		t.Fatalf("holdfast snapshot inspect: %v\n%s", err, out)
	}

	// The live state moves on: the lock changes hands twice (LockIndex
	// 3), a key changes, one appears.
	acquire(true, kv.Release, &api.KVPair{Key: "svc/leader", Session: sid})
	acquire(true, kv.Acquire, &api.KVPair{Key: "svc/leader", Session: sid})
	acquire(true, kv.Release, &api.KVPair{Key: "svc/leader", Session: sid})
	acquire(true, kv.Acquire, &api.KVPair{Key: "svc/leader", Session: sid})
	put(&api.KVPair{Key: "cfg/a", Value: []byte("2")})
	put(&api.KVPair{Key: "cfg/b", Value: []byte("new")})

	check := func(c *api.Client, lockIndex uint64, when string) {
		t.Helper()
		pairs, _, err := c.KV().List("", &api.QueryOptions{RequireConsistent: true})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, p := range pairs {
			got = append(got, p.Key+"="+string(p.Value))
		}
		if strings.Join(got, " ") != "cfg/a=1 svc/leader=me" {
			t.Fatalf("%s: keys %v, want the backup's", when, got)
		}
		if p := pairs[0]; p.Flags != 7 {
			t.Fatalf("%s: cfg/a flags %d, want 7", when, p.Flags)
		}
		if p := pairs[1]; p.Session != sid || p.LockIndex != lockIndex {
			t.Fatalf("%s: svc/leader = session %q LockIndex %d, want %s at %d", when, p.Session, p.LockIndex, sid, lockIndex)
		}
	}
	if err := c.Snapshot().Restore(nil, bytes.NewReader(archive)); err != nil {
		t.Fatal(err)
	}
	check(c, 4, "after Restore") // above the live 3, though the backup says 1

	// The CLI's file restores the same way, and again above what was live.
	acquire(true, kv.Release, &api.KVPair{Key: "svc/leader", Session: sid})
	acquire(true, kv.Acquire, &api.KVPair{Key: "svc/leader", Value: []byte("me"), Session: sid}) // 5
	out, err = exec.Command(binPath, "snapshot", "restore", "-http-addr", a.httpAddr, file).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "Restored snapshot" {
		t.Fatalf("holdfast snapshot restore: %v\n%s", err, out)
	}
	check(c, 6, "after the CLI's restore")

	// A damaged archive is a 400 that changes nothing.
	bad := bytes.Clone(archive)
	bad[len(bad)-12] ^= 1
	err = c.Snapshot().Restore(nil, bytes.NewReader(bad))
	if err == nil || !strings.Contains(err.Error(), "400") || !strings.Contains(err.Error(), "snapshot archive") {
		t.Fatalf("damaged archive: %v, want a 400 naming the archive", err)
	}
	check(c, 6, "after a refused restore")

	a.kill()
	b := startAgent(t, agentOpts{dataDir: dir, raftAddr: a.raftAddr})
	check(b.client(), 6, "after SIGKILL and a restart")
}
