package server

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/holdfast/holdfast/internal/state"
)

// A snapshot archive is what GET /v1/snapshot serves and PUT /v1/snapshot
// takes back, laid out as Consul lays out its own: a gzipped tar of
//
//	meta.json   ArchiveMeta
//	state.bin   the state machine's snapshot, as raft stores it
//	SHA256SUMS  "<hex>  <name>" for the two files above
//
// The state inside is holdfast's (state.Snapshot's JSON records), not
// Consul's, so an archive moves between holdfast servers only.
const (
	archiveMetaName  = "meta.json"
	archiveStateName = "state.bin"
	archiveSumsName  = "SHA256SUMS"
	// archiveFormat marks an archive as holdfast's.
	archiveFormat = "holdfast-snapshot-1"
	// maxArchiveMeta bounds meta.json and SHA256SUMS, which are a few
	// hundred bytes.
	maxArchiveMeta = 64 << 10
)

// ArchiveMeta describes the snapshot in an archive: Consul's fields (ID,
// Size, Index, Term, Version: raft's snapshot version) and the format.
type ArchiveMeta struct {
	Format  string
	ID      string
	Size    int64 // of state.bin
	Index   uint64
	Term    uint64
	Version int
}

// ArchiveError is an archive that cannot be restored: not one, damaged, or
// not holdfast's. It is the client's to fix, not to retry.
type ArchiveError struct{ Msg string }

func (e *ArchiveError) Error() string { return "snapshot archive: " + e.Msg }

// BadInput implements httpapi.BadInput: the archive is the client's to fix.
func (e *ArchiveError) BadInput() bool { return true }

func archiveErrorf(format string, args ...any) error {
	return &ArchiveError{Msg: fmt.Sprintf(format, args...)}
}

// WriteArchive writes an archive of meta and the state read from st, which
// must be exactly meta.Size bytes.
func WriteArchive(w io.Writer, meta ArchiveMeta, st io.Reader) error {
	meta.Format = archiveFormat
	mb, err := json.Marshal(meta)
	if err != nil {
		return err
	}
	zw := gzip.NewWriter(w)
	tw := tar.NewWriter(zw)
	now := time.Now()
	file := func(name string, size int64, body io.Reader) ([]byte, error) {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: size, ModTime: now, Typeflag: tar.TypeReg}); err != nil {
			return nil, err
		}
		h := sha256.New()
		n, err := io.Copy(tw, io.TeeReader(body, h))
		if err == nil && n != size {
			err = fmt.Errorf("%s was %d bytes, not %d", name, n, size)
		}
		return h.Sum(nil), err
	}
	metaSum, err := file(archiveMetaName, int64(len(mb)), bytes.NewReader(mb))
	if err != nil {
		return err
	}
	stateSum, err := file(archiveStateName, meta.Size, st)
	if err != nil {
		return err
	}
	sums := fmt.Sprintf("%x  %s\n%x  %s\n", metaSum, archiveMetaName, stateSum, archiveStateName)
	if _, err := file(archiveSumsName, int64(len(sums)), strings.NewReader(sums)); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return zw.Close()
}

// ReadArchive reads and checks a whole archive: its three files, once
// each, and nothing else; their sums; the format and the state's size.
// Every fault is an *ArchiveError, except a failure of r itself.
func ReadArchive(r io.Reader) (ArchiveMeta, []byte, error) {
	var meta ArchiveMeta
	zr, err := gzip.NewReader(bufio.NewReader(sourceReader{r}))
	if err != nil {
		return meta, nil, readFault("it is not gzip-compressed", err)
	}
	tr := tar.NewReader(zr)
	files := map[string][]byte{}
	sums := map[string]string{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return meta, nil, readFault("its tar stream is damaged", err)
		}
		name := hdr.Name
		limit := int64(maxArchiveMeta)
		switch name {
		case archiveStateName:
			limit = hdr.Size
		case archiveMetaName, archiveSumsName:
		default:
			return meta, nil, archiveErrorf("it holds %q, which is none of %s, %s and %s", name, archiveMetaName, archiveStateName, archiveSumsName)
		}
		if _, dup := files[name]; dup {
			return meta, nil, archiveErrorf("it holds %s twice", name)
		}
		if hdr.Typeflag != tar.TypeReg || hdr.Size < 0 || hdr.Size > limit {
			return meta, nil, archiveErrorf("%s is not a regular file of at most %d bytes", name, limit)
		}
		b, err := readAllSized(tr, hdr.Size)
		if err != nil {
			return meta, nil, readFault("its "+name+" is cut short", err)
		}
		files[name] = b
		if name != archiveSumsName {
			sum := sha256.Sum256(b)
			sums[name] = hex.EncodeToString(sum[:])
		}
	}
	// The gzip stream must end where the tar does, with its checksum.
	if _, err := io.Copy(io.Discard, zr); err != nil {
		return meta, nil, readFault("its gzip stream is damaged", err)
	}
	for _, name := range []string{archiveMetaName, archiveStateName, archiveSumsName} {
		if _, ok := files[name]; !ok {
			return meta, nil, archiveErrorf("it has no %s", name)
		}
	}
	listed := map[string]bool{}
	for _, line := range strings.Split(strings.TrimRight(string(files[archiveSumsName]), "\n"), "\n") {
		sum, name, ok := strings.Cut(line, "  ")
		want, known := sums[name]
		if !ok || !known || listed[name] {
			return meta, nil, archiveErrorf("%s has a line that is not \"<sha256>  <file>\" for one of its files: %q", archiveSumsName, line)
		}
		if sum != want {
			return meta, nil, archiveErrorf("%s does not match its SHA-256 in %s: the archive is damaged", name, archiveSumsName)
		}
		listed[name] = true
	}
	if len(listed) != len(sums) {
		return meta, nil, archiveErrorf("%s does not list every file", archiveSumsName)
	}
	dec := json.NewDecoder(bytes.NewReader(files[archiveMetaName]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&meta); err != nil || meta.Format == "" {
		return meta, nil, archiveErrorf("its %s is not holdfast's (was it taken from Consul? Consul's state is encoded its own way, which holdfast does not read)", archiveMetaName)
	}
	if meta.Format != archiveFormat {
		return meta, nil, archiveErrorf("its format is %q, which this holdfast does not read (it reads %q)", meta.Format, archiveFormat)
	}
	st := files[archiveStateName]
	if int64(len(st)) != meta.Size {
		return meta, nil, archiveErrorf("%s is %d bytes where %s says %d", archiveStateName, len(st), archiveMetaName, meta.Size)
	}
	return meta, st, nil
}

// readAllSized reads exactly n bytes of r, growing its buffer as the
// bytes come rather than trusting n for one allocation.
func readAllSized(r io.Reader, n int64) ([]byte, error) {
	var buf bytes.Buffer
	buf.Grow(int(min(n, 1<<20)))
	if _, err := io.CopyN(&buf, r, n); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// readFault is an archive fault found by a decoder, unless the reader
// under it failed (a client that hung up), which stays what it is.
func readFault(what string, err error) error {
	var re *readError
	if errors.As(err, &re) {
		return re.err
	}
	return archiveErrorf("%s (%v)", what, err)
}

// readError marks a failure of the reader an archive comes from (see
// ReadArchive), as opposed to a fault of its bytes.
type readError struct{ err error }

func (e *readError) Error() string { return e.err.Error() }

// sourceReader wraps the archive's reader so that its own failures are
// told apart from damage.
type sourceReader struct{ r io.Reader }

func (s sourceReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		err = &readError{err}
	}
	return n, err
}

// CountArchiveState reads an archive's state (as ReadArchive returns it)
// as a restore would, and counts its keys and sessions.
func CountArchiveState(st []byte) (keys, sessions int, err error) {
	s, err := state.Restore(bytes.NewReader(st))
	if err != nil {
		return 0, 0, archiveErrorf("its state does not read back: %v", err)
	}
	_, kvs := s.KVList(nil, "")
	_, all := s.SessionList(nil)
	return len(kvs), len(all), nil
}
