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
// checkTail tells the two apart. It walks the tail segment as raft-wal
// does, and from the end of the last commit frame the walk passes (not
// from where the walk stops: a damaged length field sends it far past the
// data, into the zeros of the unwritten rest of the file, and every batch
// it jumped over would go unseen) looks for a committed batch: two commit
// frames of which the second's checksum matches the bytes between them. A batch whose commit frame checks out
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
// checkTail also finishes such a rotation before raft-wal opens the log: it
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
	// keptEnd is the end of the last commit frame the walk passes (0, the
	// file's start, if none): where the batches raft-wal drops begin.
	keptEnd int64
}

// readTail walks a tail segment as raft-wal's recovery does.
func readTail(b []byte) tailState {
	type commit struct {
		off, crcStart int64
		entries       uint64
		index         int64 // an index frame's data offset in this batch, or 0
	}
	var (
		commits    []commit
		entries    uint64
		batchIndex int64
		prevEnd    int64 // the checksum of the first commit starts at the file's start
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
	// raft-wal trusts a final commit that entries follow, and checks the
	// checksum of one that ends the data.
	complete := final.entries < entries ||
		crc32.Checksum(b[final.crcStart:final.off], castagnoli) == binary.LittleEndian.Uint32(b[final.off+4:final.off+8])
	switch {
	case complete && final.index != 0:
		return tailState{sealed: true, indexStart: final.index, entries: final.entries, keptEnd: prevEnd}
	case !complete && final.index != 0:
		st := tailState{torn: true, tornFrom: final.crcStart, tornTo: walkEnd, keptEnd: prevEnd}
		if len(commits) > 1 {
			st.entries = commits[len(commits)-2].entries
		}
		return st
	}
	return tailState{keptEnd: prevEnd}
}

// checkTail runs the two checks above on the tail segment of ps, before
// raft-wal opens the log: it finishes a rotation cut short, and refuses a
// segment with committed batches after the point where raft-wal would end
// it. It reports whether it changed the meta store or the segment; ps is
// then stale.
func checkTail(raftDir string, meta *metadb.BoltMetaDB, ps types.PersistentState, logger hclog.Logger) (bool, error) {
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
	// Mapped, not read: a segment is 64 MiB, and a copy on the heap would
	// stay in the agent's memory long after the check. A read error of the
	// disk under the mapping is a fault, not an error value: withFaults
	// makes it one.
	b, err := syscall.Mmap(int(f.Fd()), 0, int(fi.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return false, err
	}
	defer syscall.Munmap(b)
	readErr := func(err error) error {
		return fmt.Errorf("server: reading raft log segment %s: %w", path, err)
	}
	var st tailState
	if err := withFaults(func() { st = readTail(b) }); err != nil {
		return false, readErr(err)
	}
	changed, start := false, st.keptEnd
	switch {
	case st.sealed:
		if st.entries == 0 {
			break
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
		return true, nil // sealed now: not the tail any more
	case st.torn:
		// The sealing batch never completed, so it was never
		// acknowledged: zero it, index frame and all, and raft-wal
		// recovers the segment open, as it means to. (The mapping
		// shares the file's pages: it reads the zeros below.)
		if _, err := f.WriteAt(make([]byte, st.tornTo-st.tornFrom), st.tornFrom); err != nil {
			return false, fmt.Errorf("server: clearing the torn last batch of %s: %w", path, err)
		}
		if err := f.Sync(); err != nil {
			return false, fmt.Errorf("server: clearing the torn last batch of %s: %w", path, err)
		}
		logger.Warn("cleared the torn last batch of the raft log's tail segment, which sealed it (never acknowledged)",
			"segment", path, "from", st.tornFrom, "to", st.tornTo)
		changed, start = true, st.tornFrom
	}
	var committed int64
	if err := withFaults(func() { committed = committedAfter(b, start) }); err != nil {
		return changed, readErr(err)
	}
	if committed == 0 {
		return changed, nil
	}
	if start < walFileHeaderLen {
		start = walFileHeaderLen
	}
	return changed, fmt.Errorf("server: raft log segment %s is damaged at offset %d: acknowledged writes follow (a committed batch at offset %d), "+
		"and the log would silently end before them; restore the data directory from a backup. "+
		"To start anyway with only the writes before the damage, zero the rest of the file first "+
		"(fallocate -p -o %d -l $(( $(stat -c %%s %s) - %d )) %s)", path, start, committed, start, path, start, path)
}
