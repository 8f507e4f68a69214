package httpapi

import (
	"encoding/base64"
	"net/http"
	"strconv"

	"github.com/holdfast/holdfast/internal/state"
)

// writeEntries writes a KV read's answer, a JSON array of entries. Every
// GET of a key and every wake-up of a blocking query on one ends here, so
// the compact form is built by hand instead of through encoding/json's
// reflection; the bytes are the same as json.Marshal's (kvjson_test.go
// checks, field by field). Strings that json.Marshal would escape, and
// ?pretty, go through encoding/json.
func writeEntries(w http.ResponseWriter, r *http.Request, ents []*state.DirEntry) error {
	if wantPretty(r) {
		return writeJSON(w, r, ents)
	}
	buf, ok := appendEntries(make([]byte, 0, entriesSize(ents)), ents)
	if !ok {
		return writeJSON(w, r, ents)
	}
	return sendJSON(w, buf)
}

// entriesSize is a close upper bound of the encoding's length for plain
// strings, so that appendEntries allocates once.
func entriesSize(ents []*state.DirEntry) int {
	n := 2
	for _, e := range ents {
		n += entrySize(e)
	}
	return n
}

// entrySize is entriesSize for one entry.
func entrySize(e *state.DirEntry) int {
	if e == nil {
		return 5
	}
	return 160 + len(e.Key) + len(e.Session) + base64.StdEncoding.EncodedLen(len(e.Value))
}

// appendEntries appends ents as json.Marshal would, or reports false if a
// string in them needs escaping (then buf is garbage).
func appendEntries(buf []byte, ents []*state.DirEntry) ([]byte, bool) {
	if ents == nil {
		return append(buf, "null"...), true
	}
	buf = append(buf, '[')
	for i, e := range ents {
		if i > 0 {
			buf = append(buf, ',')
		}
		var ok bool
		if buf, ok = appendEntry(buf, e); !ok {
			return buf, false
		}
	}
	return append(buf, ']'), true
}

// appendEntry appends e as json.Marshal would, or reports false if a
// string in it needs escaping.
func appendEntry(buf []byte, e *state.DirEntry) ([]byte, bool) {
	if e == nil {
		return append(buf, "null"...), true
	}
	if !plainJSON(e.Key) || !plainJSON(e.Session) {
		return buf, false
	}
	buf = append(buf, `{"LockIndex":`...)
	buf = strconv.AppendUint(buf, e.LockIndex, 10)
	buf = append(buf, `,"Key":"`...)
	buf = append(buf, e.Key...)
	buf = append(buf, `","Flags":`...)
	buf = strconv.AppendUint(buf, e.Flags, 10)
	buf = append(buf, `,"Value":`...)
	if e.Value == nil {
		buf = append(buf, "null"...)
	} else {
		buf = append(buf, '"')
		buf = base64.StdEncoding.AppendEncode(buf, e.Value)
		buf = append(buf, '"')
	}
	if e.Session != "" {
		buf = append(buf, `,"Session":"`...)
		buf = append(buf, e.Session...)
		buf = append(buf, '"')
	}
	buf = append(buf, `,"CreateIndex":`...)
	buf = strconv.AppendUint(buf, e.CreateIndex, 10)
	buf = append(buf, `,"ModifyIndex":`...)
	buf = strconv.AppendUint(buf, e.ModifyIndex, 10)
	return append(buf, '}'), true
}

// appendTxnResults appends a committed transaction's answer, what
// json.Marshal makes of txnResponse{Results: res}, or reports false if a
// string in it needs escaping.
func appendTxnResults(buf []byte, res []*state.TxnResult) ([]byte, bool) {
	buf = append(buf, `{"Results":`...)
	if res == nil {
		buf = append(buf, "null"...)
	} else {
		buf = append(buf, '[')
		for i, r := range res {
			if i > 0 {
				buf = append(buf, ',')
			}
			switch {
			case r == nil:
				buf = append(buf, "null"...)
			case r.KV == nil:
				buf = append(buf, "{}"...)
			default:
				var ok bool
				buf = append(buf, `{"KV":`...)
				if buf, ok = appendEntry(buf, r.KV); !ok {
					return buf, false
				}
				buf = append(buf, '}')
			}
		}
		buf = append(buf, ']')
	}
	return append(buf, `,"Errors":null}`...), true
}

// plainJSON reports whether json.Marshal writes s as itself between
// quotes: printable ASCII other than '"', '\\' and the HTML characters it
// escapes ('<', '>', '&').
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		if !plainByte[s[i]] {
			return false
		}
	}
	return true
}

// plainByte is plainJSON's test for one byte, as a table: every KV answer
// checks each byte of every key and session, one load per byte instead of
// seven comparisons.
var plainByte = func() (t [256]bool) {
	for c := 0x20; c < 0x7f; c++ {
		switch c {
		case '"', '\\', '<', '>', '&':
		default:
			t[c] = true
		}
	}
	return t
}()
