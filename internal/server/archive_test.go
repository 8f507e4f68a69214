package server

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/holdfast/holdfast/internal/state"
)

// tarGz builds a gzipped tar of the given files, in order, with no checks.
func tarGz(t testing.TB, files ...[2]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Name: f[0], Mode: 0o600, Size: int64(len(f[1])), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(f[1])); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func sumLine(name, body string) string {
	return fmt.Sprintf("%x  %s\n", sha256.Sum256([]byte(body)), name)
}

func validArchive(t testing.TB, st string) []byte {
	t.Helper()
	var buf bytes.Buffer
	meta := ArchiveMeta{ID: "2-9-1", Size: int64(len(st)), Index: 9, Term: 2, Version: 1}
	if err := WriteArchive(&buf, meta, strings.NewReader(st)); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// persisted is the snapshot encoding of st.
func persisted(t testing.TB, st *state.Store) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := st.Snapshot().Persist(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestArchiveRoundTrip(t *testing.T) {
	st := `{"Version":1}` + "\n"
	meta, got, err := ReadArchive(bytes.NewReader(validArchive(t, st)))
	want := ArchiveMeta{Format: archiveFormat, ID: "2-9-1", Size: int64(len(st)), Index: 9, Term: 2, Version: 1}
	if err != nil || meta != want || string(persisted(t, got)) != st {
		t.Fatalf("ReadArchive = %+v, %v; want %+v, an empty state", meta, err, want)
	}
	// A state of another size than the meta says is not written.
	err = WriteArchive(&bytes.Buffer{}, ArchiveMeta{Size: 3}, strings.NewReader("four"))
	if err == nil {
		t.Fatal("WriteArchive wrote a state longer than its meta's Size")
	}
}

// metaCase is an archive of state st whose meta.json has field (as
// `"Name":value`) in place of the valid one's, with sums that match.
func metaCase(st, field string) [][2]string {
	meta := fmt.Sprintf(`{"Format":%q,"ID":"x","Size":%d,"Index":1,"Term":1,"Version":1}`, archiveFormat, len(st))
	name := field[:strings.Index(field, ":")+1]
	i := strings.Index(meta, name)
	j := i + strings.IndexAny(meta[i:], ",}")
	meta = meta[:i] + field + meta[j:]
	return [][2]string{{archiveMetaName, meta}, {archiveStateName, st},
		{archiveSumsName, sumLine(archiveMetaName, meta) + sumLine(archiveStateName, st)}}
}

// Each way an archive can be wrong gets its own sentence.
func TestReadArchiveRefusals(t *testing.T) {
	st := `{"Version":1}` + "\n"
	meta := fmt.Sprintf(`{"Format":%q,"ID":"x","Size":%d,"Index":1,"Term":1,"Version":1}`, archiveFormat, len(st))
	sums := sumLine(archiveMetaName, meta) + sumLine(archiveStateName, st)
	consulMeta := `{"ID":"2-5-1","Size":667,"Index":5,"Term":2,"Version":1}`
	for _, c := range []struct {
		name  string
		files [][2]string
		want  string
	}{
		{"extra file", [][2]string{{archiveMetaName, meta}, {archiveStateName, st}, {"x", ""}, {archiveSumsName, sums}}, `holds "x"`},
		{"twice", [][2]string{{archiveMetaName, meta}, {archiveMetaName, meta}}, "holds meta.json twice"},
		{"no sums", [][2]string{{archiveMetaName, meta}, {archiveStateName, st}}, "has no SHA256SUMS"},
		{"wrong sum", [][2]string{{archiveMetaName, meta}, {archiveStateName, st + " "}, {archiveSumsName, sums}}, "state.bin does not match its SHA-256"},
		{"unlisted", [][2]string{{archiveMetaName, meta}, {archiveStateName, st}, {archiveSumsName, sumLine(archiveMetaName, meta)}}, "does not list every file"},
		{"bad line", [][2]string{{archiveMetaName, meta}, {archiveStateName, st}, {archiveSumsName, sums + "junk\n"}}, `"junk"`},
		{"Consul's", [][2]string{{archiveMetaName, consulMeta}, {archiveStateName, st},
			{archiveSumsName, sumLine(archiveMetaName, consulMeta) + sumLine(archiveStateName, st)}}, "was it taken from Consul?"},
		{"index 0", metaCase(st, `"Index":0`), "its index 0 is not a raft index"},
		{"index 2^64-1", metaCase(st, `"Index":18446744073709551615`), "its index 18446744073709551615 is not a raft index"},
		{"version 99", metaCase(st, `"Version":99`), "its raft snapshot version 99 is not one this holdfast reads"},
		{"a number too big", metaCase(st, `"Term":1e99`), "its meta.json does not read"},
		{"state", [][2]string{{archiveMetaName, meta}, {archiveStateName, strings.Repeat("\x00", 14)},
			{archiveSumsName, sumLine(archiveMetaName, meta) + sumLine(archiveStateName, strings.Repeat("\x00", 14))}}, "its state does not read back"},
		{"size", [][2]string{{archiveMetaName, strings.Replace(meta, `"Size":14`, `"Size":15`, 1)}, {archiveStateName, st},
			{archiveSumsName, sumLine(archiveMetaName, strings.Replace(meta, `"Size":14`, `"Size":15`, 1)) + sumLine(archiveStateName, st)}}, "is 14 bytes where meta.json says 15"},
	} {
		_, _, err := ReadArchive(bytes.NewReader(tarGz(t, c.files...)))
		var ae *ArchiveError
		if !errors.As(err, &ae) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want an ArchiveError saying %q", c.name, err, c.want)
		}
	}
}

// ReadArchive never panics, refuses with an ArchiveError, and what it
// accepts is written back the same by WriteArchive.
func FuzzReadArchive(f *testing.F) {
	f.Add(validArchive(f, `{"Version":1}`+"\n"))
	f.Add(validArchive(f, ""))
	f.Add([]byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff})
	f.Add(tarGz(f, [2]string{archiveMetaName, "{}"}))
	f.Fuzz(func(t *testing.T, b []byte) {
		meta, st, err := ReadArchive(bytes.NewReader(b))
		if err != nil {
			var ae *ArchiveError
			if !errors.As(err, &ae) {
				t.Fatalf("error that is no ArchiveError: %v", err)
			}
			return
		}
		enc := persisted(t, st)
		meta.Size = int64(len(enc))
		var buf bytes.Buffer
		if err := WriteArchive(&buf, meta, bytes.NewReader(enc)); err != nil {
			t.Fatal(err)
		}
		meta2, st2, err := ReadArchive(&buf)
		if err != nil || !reflect.DeepEqual(meta2, meta) || !bytes.Equal(persisted(t, st2), enc) {
			t.Fatalf("accepted archive does not round-trip: %+v %v", meta2, err)
		}
	})
}

// Finding (verification of the restore fixes): a 1 MB archive whose state
// was valid JSON with a 1 GiB value took the agent to 6 GB and was
// restored. A state.bin that expands more than bombRatio-fold past
// bombFloor is refused as it is read.
func TestReadArchiveRefusesBomb(t *testing.T) {
	defer func(f int64) { bombFloor = f }(bombFloor)
	bombFloor = 4 << 20
	var state strings.Builder
	state.WriteString(`{"Version":1}` + "\n" + `{"T":"kvs","V":{"Key":"k","Value":"`)
	state.WriteString(strings.Repeat("A", int(bombFloor)+(1<<20)))
	state.WriteString(`"}}` + "\n")
	st := state.String()
	var buf bytes.Buffer
	if err := WriteArchive(&buf, ArchiveMeta{ID: "1-9-1", Size: int64(len(st)), Index: 9, Term: 1, Version: 1}, strings.NewReader(st)); err != nil {
		t.Fatal(err)
	}
	_, _, err := ReadArchive(&buf)
	var ae *ArchiveError
	if !errors.As(err, &ae) || !strings.Contains(err.Error(), "-fold") || strings.Contains(err.Error(), "does not read back") {
		t.Fatalf("bomb of %d bytes in %d: %v", len(st), buf.Len(), err)
	}
}
