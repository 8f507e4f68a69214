package server

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/segment"
	"github.com/hashicorp/raft-wal/types"
)

// A check raft-wal does not make. raft-wal reads the tail segment of the
// log from its start, frame by frame, and takes the first frame header it
// cannot read as the end of the log: after a crash, that is the torn last
// batch, which was never acknowledged. But damage in the middle of the
// segment (a bad sector, a stray write) ends the log there too, and every
// batch after it, acknowledged long ago, is dropped without a word.
//
// damagedTail tells the two apart. It walks the tail segment as raft-wal
// does, to the point where raft-wal's walk stops, and then looks further
// for a committed batch: two commit frames of which the second's checksum
// matches the bytes between them. A batch whose commit frame checks out
// was completely written, and its commit came after the earlier one, so
// the point where the walk stopped was not the end of what was written:
// the log is damaged there. A torn last batch leaves no such pair (it has
// at most one commit frame, whose checksum fails), and neither does the
// stale tail of a batch that a later run wrote over.
//
// The frame format is raft-wal's (segment/format.go, v0.4.1): a 32-byte
// file header, then frames aligned to 8 bytes, each with an 8-byte header
// (type, 3 reserved bytes, then a little-endian uint32: the payload length,
// or for a commit frame the CRC-32C of everything from the end of the
// previous commit frame, or the file's start, to this frame).

const (
	walFileHeaderLen  = 32
	walFrameHeaderLen = 8
	walFrameEntry     = 1
	walFrameIndex     = 2
	walFrameCommit    = 3
	walMaxEntrySize   = 64 << 20
	// pairWindow is how many earlier commit-like frames each one is
	// checked against: entry payloads can look like a commit header.
	pairWindow = 16
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// damagedTail returns the offset at which the first batch starts that
// raft-wal's recovery of the segment at path would not keep (the end of
// the last commit frame its walk passes), and the offset of a committed
// batch found after it (0 if none).
//
// The search starts there, not where the walk stopped: a damaged length
// field sends the walk far past the data (into the zeros of the unwritten
// rest of the file), and every batch it jumped over would go unseen.
func damagedTail(path string) (start, committed int64, err error) {
	// Mapped, not read: a segment is 64 MiB, and a copy on the heap would
	// stay in the agent's memory long after the check.
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, 0, err
	}
	if fi.Size() < walFileHeaderLen+walFrameHeaderLen {
		return 0, 0, nil
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, int(fi.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return 0, 0, err
	}
	defer syscall.Munmap(b)
	// A read error of the disk under the mapping is a fault, not an
	// error value: make it one.
	err = withFaults(func() {
		// The first commit's checksum starts at the file's start.
		start = 0
		walkFrames(b, func(off int64, typ byte) {
			if typ == walFrameCommit {
				start = off + walFrameHeaderLen
			}
		})
		committed = committedAfter(b, start)
	})
	if start == 0 {
		start = walFileHeaderLen
	}
	return start, committed, err
}

// committedAfter returns the offset of the first commit frame after from
// whose checksum matches the bytes since from or since one of the commit
// frames before it: a batch that was completely written. 0 if there is
// none.
func committedAfter(b []byte, from int64) int64 {
	starts := []int64{from}
	o := from
	if o < walFileHeaderLen {
		o = walFileHeaderLen
	}
	for ; o+walFrameHeaderLen <= int64(len(b)); o += walFrameHeaderLen {
		if b[o] != walFrameCommit || b[o+1] != 0 || b[o+2] != 0 || b[o+3] != 0 {
			continue
		}
		want := binary.LittleEndian.Uint32(b[o+4 : o+8])
		for i := len(starts) - 1; i >= 0 && i >= len(starts)-pairWindow; i-- {
			if crc32.Checksum(b[starts[i]:o], castagnoli) == want {
				return o
			}
		}
		starts = append(starts, o+walFrameHeaderLen)
	}
	return 0
}

// walkFrames is raft-wal's walk through a segment: it calls each (if not
// nil) with the offset and type of every frame it passes, and returns the
// offset of the first frame header that is zero, of an unknown type, or
// runs past the data.
func walkFrames(b []byte, each func(off int64, typ byte)) int64 {
	o := int64(walFileHeaderLen)
	for o+walFrameHeaderLen <= int64(len(b)) {
		typ := b[o]
		next := o
		switch typ {
		case walFrameCommit:
			next += walFrameHeaderLen
		case walFrameEntry, walFrameIndex:
			n := int64(binary.LittleEndian.Uint32(b[o+4 : o+8]))
			if n > walMaxEntrySize {
				return o
			}
			next += walFrameHeaderLen + n + (walFrameHeaderLen-n%walFrameHeaderLen)%walFrameHeaderLen
		default:
			return o
		}
		if each != nil {
			each(o, typ)
		}
		o = next
	}
	return o
}

// checkTail refuses a tail segment with committed batches after the point
// where raft-wal would end it.
func checkTail(path string) error {
	start, committed, err := damagedTail(path)
	if err != nil {
		return fmt.Errorf("server: reading raft log segment %s: %w", path, err)
	}
	if committed == 0 {
		return nil
	}
	return fmt.Errorf("server: raft log segment %s is damaged at offset %d: acknowledged writes follow (a committed batch at offset %d), "+
		"and the log would silently end before them; restore the data directory from a backup. "+
		"To start anyway with only the writes before the damage, zero the rest of the file first "+
		"(fallocate -p -o %d -l $(( $(stat -c %%s %s) - %d )) %s)", path, start, committed, start, path, start, path)
}

// A second gap in raft-wal's recovery (v0.4.1). The append that fills the
// tail segment seals it in the file (an index frame, then the batch's
// commit); the rotation that records the seal in the meta store and
// creates the next segment runs just after, in the background. A crash in
// between, or a shutdown that overtakes the rotation (raft-wal's Close
// stops it), leaves a tail that the meta store calls open and the file
// calls sealed. raft-wal opens it as sealed, never rotates it, and refuses
// every write with ErrSealed: the server could never write again. And if
// the crash tore the sealing batch itself, raft-wal keeps the torn seal
// while it drops the batch, with the same result.
//
// sealTail finishes such a rotation before raft-wal opens the log: it
// records the seal in the meta store and lists a next segment (which
// raft-wal then creates, as after any crash between the two), or, for a
// torn seal, zeroes the torn batch (never acknowledged: its commit does
// not check out), as raft-wal's recovery means to drop it.

// tailState is what a tail segment's file says of itself.
type tailState struct {
	sealed     bool   // its last batch holds an index frame and checks out
	torn       bool   // its last batch holds an index frame and does not
	indexStart int64  // the index data's offset, when sealed
	entries    uint64 // entries up to the last commit that checks out
	tornFrom   int64  // where the torn batch starts, when torn
	tornTo     int64  // where the walk ended, when torn
}

// readTail walks a tail segment as raft-wal's recovery does.
func readTail(b []byte) tailState {
	type commit struct {
		off, crcStart int64
		entries       uint64
		index         int64 // an index frame's data offset in this batch, or 0
	}
	var (
		commits      []commit
		entries      uint64
		batchIndex   int64
		prevEnd      int64 // the checksum of the first commit starts at the file's start
		lastComplete *commit
	)
	walkEnd := walkFrames(b, func(off int64, typ byte) {
		switch typ {
		case walFrameEntry:
			entries++
		case walFrameIndex:
			batchIndex = off + walFrameHeaderLen
		case walFrameCommit:
			commits = append(commits, commit{off: off, crcStart: prevEnd, entries: entries, index: batchIndex})
			prevEnd, batchIndex = off+walFrameHeaderLen, 0
		}
	})
	if len(commits) == 0 {
		return tailState{}
	}
	final := commits[len(commits)-1]
	ok := crc32.Checksum(b[final.crcStart:final.off], castagnoli) == binary.LittleEndian.Uint32(b[final.off+4:final.off+8])
	if ok || final.entries < entries { // raft-wal trusts a commit that entries follow
		lastComplete = &final
	} else if len(commits) > 1 {
		lastComplete = &commits[len(commits)-2]
	}
	switch {
	case lastComplete == &final && final.index != 0:
		return tailState{sealed: true, indexStart: final.index, entries: final.entries}
	case lastComplete != &final && final.index != 0:
		st := tailState{torn: true, tornFrom: final.crcStart, tornTo: walkEnd}
		if lastComplete != nil {
			st.entries = lastComplete.entries
		}
		return st
	}
	return tailState{}
}

// sealTail finishes, before raft-wal opens the log, a rotation that a
// crash or a shutdown cut short (see above). It reports whether it changed
// anything; ps is then stale.
func sealTail(raftDir string, meta *metadb.BoltMetaDB, ps types.PersistentState, logger hclog.Logger) (bool, error) {
	if len(ps.Segments) == 0 {
		return false, nil
	}
	tail := ps.Segments[len(ps.Segments)-1]
	if !tail.SealTime.IsZero() {
		return false, nil
	}
	path := filepath.Join(raftDir, segment.FileName(tail))
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil // see checkLogFiles
	}
	if err != nil {
		return false, fmt.Errorf("server: opening raft log segment %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return false, err
	}
	if fi.Size() < walFileHeaderLen+walFrameHeaderLen {
		return false, nil
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, int(fi.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return false, err
	}
	var st tailState
	err = withFaults(func() { st = readTail(b) })
	syscall.Munmap(b)
	if err != nil {
		return false, fmt.Errorf("server: reading raft log segment %s: %w", path, err)
	}
	switch {
	case st.torn:
		// The sealing batch never completed, so it was never
		// acknowledged: zero it, index frame and all, and raft-wal
		// recovers the segment open, as it means to.
		if _, err := f.WriteAt(make([]byte, st.tornTo-st.tornFrom), st.tornFrom); err != nil {
			return false, fmt.Errorf("server: clearing the torn last batch of %s: %w", path, err)
		}
		if err := f.Sync(); err != nil {
			return false, fmt.Errorf("server: clearing the torn last batch of %s: %w", path, err)
		}
		logger.Warn("cleared the torn last batch of the raft log's tail segment, which sealed it (never acknowledged)",
			"segment", path, "from", st.tornFrom, "to", st.tornTo)
		return true, nil
	case st.sealed:
		if st.entries == 0 {
			return false, nil
		}
		now := time.Now()
		maxIndex := tail.BaseIndex + st.entries - 1
		sealed := tail
		sealed.SealTime = now
		sealed.MaxIndex = maxIndex
		sealed.IndexStart = uint64(st.indexStart)
		next := types.SegmentInfo{ID: ps.NextSegmentID, BaseIndex: maxIndex + 1, MinIndex: maxIndex + 1,
			SizeLimit: tail.SizeLimit, Codec: tail.Codec, CreateTime: now}
		segs := append(append([]types.SegmentInfo(nil), ps.Segments[:len(ps.Segments)-1]...), sealed, next)
		if err := meta.CommitState(types.PersistentState{NextSegmentID: ps.NextSegmentID + 1, Segments: segs}); err != nil {
			return false, fmt.Errorf("server: recording the seal of raft log segment %s: %w", path, err)
		}
		logger.Warn("finished the rotation of the raft log that a crash or shutdown cut short: its tail segment was sealed in its file, not in the meta store",
			"segment", path, "max_index", maxIndex)
		return true, nil
	}
	return false, nil
}
