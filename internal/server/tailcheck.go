package server

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"syscall"
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
