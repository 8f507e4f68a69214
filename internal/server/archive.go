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

	"github.com/hashicorp/raft"

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
// each, and nothing else; their sums; the format, the raft metadata and
// the state's size; and the state itself, decoded as it streams in (the
// archive's bytes are not kept) and checked for keys held by sessions it
// does not have. Every fault is an *ArchiveError, except a failure of r
// itself.
func ReadArchive(r io.Reader) (ArchiveMeta, *state.Store, error) {
	var meta ArchiveMeta
	src := &sourceReader{r: r}
	zr, err := gzip.NewReader(bufio.NewReader(src))
	if err != nil {
		return meta, nil, readFault("it is not gzip-compressed", err)
	}
	tr := tar.NewReader(zr)
	files := map[string][]byte{} // meta.json and SHA256SUMS
	sums := map[string]string{}  // of meta.json and state.bin
	var st *state.Store
	var stSize int64
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return meta, nil, readFault("its tar stream is damaged", err)
		}
		name := hdr.Name
		switch name {
		case archiveMetaName, archiveSumsName, archiveStateName:
		default:
			return meta, nil, archiveErrorf("it holds %q, which is none of %s, %s and %s", name, archiveMetaName, archiveStateName, archiveSumsName)
		}
		if _, dup := sums[name]; dup || files[name] != nil {
			return meta, nil, archiveErrorf("it holds %s twice", name)
		}
		if hdr.Typeflag != tar.TypeReg || hdr.Size < 0 || (name != archiveStateName && hdr.Size > maxArchiveMeta) {
			return meta, nil, archiveErrorf("%s is not a regular file of at most %d bytes", name, maxArchiveMeta)
		}
		h := sha256.New()
		body := io.TeeReader(tr, h)
		if name == archiveStateName {
			st, err = state.Restore(&bombGuard{r: body, src: src})
			if err != nil {
				return meta, nil, readFault("its state does not read back", err)
			}
			// The decoder stops at the end of the JSON; the sum covers
			// every byte of the file.
			if _, err := io.Copy(io.Discard, body); err != nil {
				return meta, nil, readFault("its state.bin is cut short", err)
			}
			stSize = hdr.Size
		} else {
			b := make([]byte, hdr.Size) // at most maxArchiveMeta
			if _, err := io.ReadFull(body, b); err != nil {
				return meta, nil, readFault("its "+name+" is cut short", err)
			}
			files[name] = b
		}
		if name != archiveSumsName {
			sums[name] = hex.EncodeToString(h.Sum(nil))
		}
	}
	// The gzip stream must end where the tar does, with its checksum.
	if _, err := io.Copy(io.Discard, zr); err != nil {
		return meta, nil, readFault("its gzip stream is damaged", err)
	}
	for _, name := range []string{archiveMetaName, archiveStateName, archiveSumsName} {
		if _, ok := sums[name]; !ok && files[name] == nil {
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
	if err := dec.Decode(&meta); err != nil {
		return meta, nil, archiveErrorf("its %s does not read (%v)", archiveMetaName, err)
	}
	switch {
	case meta.Format == "":
		return meta, nil, archiveErrorf("its %s is not holdfast's (was it taken from Consul? Consul's state is encoded its own way, which holdfast does not read)", archiveMetaName)
	case meta.Format != archiveFormat:
		return meta, nil, archiveErrorf("its format is %q, which this holdfast does not read (it reads %q)", meta.Format, archiveFormat)
	case meta.Version < int(raft.SnapshotVersionMin) || meta.Version > int(raft.SnapshotVersionMax):
		return meta, nil, archiveErrorf("its raft snapshot version %d is not one this holdfast reads (%d to %d)", meta.Version, raft.SnapshotVersionMin, raft.SnapshotVersionMax)
	case meta.Index == 0 || meta.Index > maxArchiveIndex:
		return meta, nil, archiveErrorf("its index %d is not a raft index (1 to %d)", meta.Index, uint64(maxArchiveIndex))
	case meta.Size != stSize:
		return meta, nil, archiveErrorf("%s is %d bytes where %s says %d", archiveStateName, stSize, archiveMetaName, meta.Size)
	}
	if err := st.CheckHeld(); err != nil {
		return meta, nil, archiveErrorf("its state is not consistent: %v", err)
	}
	if mi := st.MaxIndex(); mi > meta.Index {
		return meta, nil, archiveErrorf("its state was changed at index %d, after the index %d it was taken at", mi, meta.Index)
	}
	return meta, st, nil
}

// maxArchiveIndex is the highest raft index an archive may claim: far
// above any log's (a billion writes a second for a century is 2^62), and
// far enough below 2^64 that raft's index after the restore (one past the
// larger of its own and the archive's) cannot wrap.
const maxArchiveIndex = 1 << 62

// readFault is an archive fault found by a decoder, unless the reader
// under it failed (a client that hung up), which stays what it is.
func readFault(what string, err error) error {
	var re *readError
	if errors.As(err, &re) {
		return re.err
	}
	var ae *ArchiveError
	if errors.As(err, &ae) {
		return ae // found below the decoder (bombGuard)
	}
	return archiveErrorf("%s (%v)", what, err)
}

// readError marks a failure of the reader an archive comes from (see
// ReadArchive), as opposed to a fault of its bytes.
type readError struct{ err error }

func (e *readError) Error() string { return e.err.Error() }

// sourceReader wraps the archive's reader so that its own failures are
// told apart from damage, and counts the bytes read.
type sourceReader struct {
	r io.Reader
	n int64
}

func (s *sourceReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	s.n += int64(n)
	if err != nil && !errors.Is(err, io.EOF) {
		err = &readError{err}
	}
	return n, err
}

// CountArchiveState counts the keys and sessions of a store that
// ReadArchive returned.
func CountArchiveState(st *state.Store) (keys, sessions int) {
	_, kvs := st.KVList(nil, "")
	_, all := st.SessionList(nil)
	return len(kvs), len(all)
}

// A state.bin that expands more than bombRatio-fold from the compressed
// bytes read so far, past bombFloor, is refused while it is decoded: a
// 1 MB archive whose state was one key with a 1 GiB value of one byte
// repeated took the agent to 6 GB. The archives holdfast writes expand
// 1.3-fold (random values) to 180-fold (values of one byte repeated).
const bombRatio = 500

// bombFloor is a variable for the tests, which lower it.
var bombFloor int64 = 256 << 20

// bombGuard reads state.bin for ReadArchive, refusing a decompression bomb.
type bombGuard struct {
	r   io.Reader
	src *sourceReader
	n   int64
}

func (b *bombGuard) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.n += int64(n)
	if b.n > bombFloor && b.n > bombRatio*b.src.n {
		return n, archiveErrorf("its state.bin expands more than %d-fold (%d bytes from %d): not an archive holdfast wrote", bombRatio, b.n, b.src.n)
	}
	return n, err
}
