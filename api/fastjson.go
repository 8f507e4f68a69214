package api

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"sync"
	"unicode/utf8"
)

// The answers a busy client decodes most are arrays of KV entries (every
// Get and List, and every wake-up of a blocking query on a key) and
// transaction results (the lock recipes read the queue with a get-tree op).
// Through encoding/json's reflection they cost more CPU than the rest of
// the client put together, so they have a hand-written parser here.
//
// The parser is a fast path only. It knows the exact shapes of those
// answers (KVPairs, TxnResponse) and gives up on anything else: a field
// name it cannot match without folding case, a duplicate field, a number
// that is not a plain integer in range, a string with a surrogate escape
// or invalid UTF-8, nesting it does not expect, a syntax error. Then the
// same bytes go through encoding/json, so the result, error or not, is
// always what encoding/json makes of them. Unknown fields (Consul
// Enterprise's Namespace and Partition, say) are skipped, as encoding/json
// does, when their names are plain ASCII.
//
// Memory: the strings of one answer share one allocation, as do the
// values, the pairs and the results, so holding on to one pair of a long
// list keeps the whole list's strings and values alive.

// fastDecoder holds the scratch space of one decode; it is pooled.
type fastDecoder struct {
	body []byte // the response body, read whole

	b     []byte // what is being parsed
	i     int    // position in b
	depth int    // nesting of values being skipped

	strs    []byte // unescaped Key, Session and What strings, back to back
	pairs   []rawPair
	results []rawResult
	errs    []rawError
}

// rawPair is a KV entry as parsed: strings are spans of strs, the value a
// span of b still in base64.
type rawPair struct {
	lockIndex, flags, createIndex, modifyIndex uint64
	key, session                               span
	value                                      span // off < 0: null or absent
	null                                       bool // the element itself was null
}

type span struct{ off, n int }

// rawResult is one element of Results: null, an object without a KV
// entry ({} or {"KV":null}), or one with pairs[pair].
type rawResult struct {
	null bool
	pair int // -1: no KV
}

type rawError struct {
	null    bool
	opIndex int
	what    span
}

var fastPool = sync.Pool{New: func() any { return new(fastDecoder) }}

// maxPooledBody is the largest body buffer kept for reuse; a buffer grown
// by a rare huge answer is left to the garbage collector.
const maxPooledBody = 1 << 20

// emptyValue is the Value of an entry whose value is "": empty but not nil,
// as encoding/json makes it. Its capacity is 0, so appending to it copies.
var emptyValue = []byte{}

// fastDecodable reports whether out is of a type the fast path knows, and
// is still zero (encoding/json merges into what is there; the fast path
// does not).
func fastDecodable(out any) bool {
	switch v := out.(type) {
	case *KVPairs:
		return v != nil && *v == nil
	case *TxnResponse:
		return v != nil && v.Results == nil && v.Errors == nil
	}
	return false
}

// decodeJSON decodes the first JSON value read from r into out, as
// json.NewDecoder(r).Decode(out) does.
func decodeJSON(r io.Reader, out any) error {
	if !fastDecodable(out) {
		if err := json.NewDecoder(r).Decode(out); err != nil {
			return decodeError(err)
		}
		return nil
	}
	d := fastPool.Get().(*fastDecoder)
	defer d.release()
	body, err := readAll(d.body[:0], r)
	d.body = body
	if err != nil {
		return decodeError(err)
	}
	if d.decode(body, out, false) {
		return nil
	}
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(out); err != nil {
		return decodeError(err)
	}
	return nil
}

// unmarshalJSON is json.Unmarshal(b, out) with the fast path.
func unmarshalJSON(b []byte, out any) error {
	if fastDecodable(out) {
		d := fastPool.Get().(*fastDecoder)
		ok := d.decode(b, out, true)
		d.release()
		if ok {
			return nil
		}
	}
	return json.Unmarshal(b, out)
}

func decodeError(err error) error {
	return fmt.Errorf("api: decoding response: %w", err)
}

// readAll is io.ReadAll appending to buf.
func readAll(buf []byte, r io.Reader) ([]byte, error) {
	if cap(buf) == 0 {
		buf = make([]byte, 0, 4096)
	}
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

func (d *fastDecoder) release() {
	if cap(d.body) > maxPooledBody {
		d.body = nil
	}
	if cap(d.strs) > maxPooledBody {
		d.strs = nil
	}
	if cap(d.pairs) > 4096 {
		d.pairs = nil
	}
	if cap(d.results) > 4096 {
		d.results = nil
	}
	if cap(d.errs) > 4096 {
		d.errs = nil
	}
	d.b = nil
	fastPool.Put(d)
}

// decode parses b into out (which fastDecodable accepted) and reports
// whether it could. On false, out is untouched. With strict, only white
// space may follow the value (json.Unmarshal); without, whatever follows
// is ignored (json.Decoder.Decode).
func (d *fastDecoder) decode(b []byte, out any, strict bool) bool {
	d.b, d.i, d.depth = b, 0, 0
	d.strs, d.pairs, d.results, d.errs = d.strs[:0], d.pairs[:0], d.results[:0], d.errs[:0]
	switch out := out.(type) {
	case *KVPairs:
		d.ws()
		null, ok := d.kvArray()
		if !ok || !d.end(strict) {
			return false
		}
		if null {
			return true // *out is already nil
		}
		pairs, ok := d.buildPairs(0, len(d.pairs), string(d.strs))
		if !ok {
			return false
		}
		*out = pairs
		return true
	case *TxnResponse:
		d.ws()
		var resp TxnResponse
		if !d.txnResponse(&resp) || !d.end(strict) {
			return false
		}
		*out = resp
		return true
	}
	return false
}

// end checks what follows the value.
func (d *fastDecoder) end(strict bool) bool {
	if !strict {
		return true
	}
	d.ws()
	return d.i == len(d.b)
}

func (d *fastDecoder) ws() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// peek returns the next byte, or 0 at the end.
func (d *fastDecoder) peek() byte {
	if d.i < len(d.b) {
		return d.b[d.i]
	}
	return 0
}

// lit consumes the literal s (such as "null") if it is next.
func (d *fastDecoder) lit(s string) bool {
	if len(d.b)-d.i >= len(s) && string(d.b[d.i:d.i+len(s)]) == s {
		d.i += len(s)
		return true
	}
	return false
}

// array parses null or an array, calling elem for each element (which
// elem parses, null included).
func (d *fastDecoder) array(elem func() bool) (null, ok bool) {
	if d.lit("null") {
		return true, true
	}
	if d.peek() != '[' {
		return false, false
	}
	d.i++
	d.ws()
	if d.peek() == ']' {
		d.i++
		return false, true
	}
	for {
		if !elem() {
			return false, false
		}
		d.ws()
		switch d.peek() {
		case ',':
			d.i++
			d.ws()
		case ']':
			d.i++
			return false, true
		default:
			return false, false
		}
	}
}

// kvArray parses null or an array of KV entries into d.pairs.
func (d *fastDecoder) kvArray() (null, ok bool) {
	return d.array(func() bool {
		var p rawPair
		if d.lit("null") {
			p.null = true
		} else if !d.kvObject(&p) {
			return false
		}
		d.pairs = append(d.pairs, p)
		return true
	})
}

// KVPair's fields, as bits for spotting duplicates.
const (
	fLockIndex = 1 << iota
	fKey
	fFlags
	fValue
	fSession
	fCreateIndex
	fModifyIndex
)

var kvFields = []string{"LockIndex", "Key", "Flags", "Value", "Session", "CreateIndex", "ModifyIndex"}

// object parses an object, calling member for each member with its name
// (d.i at the value). member parses the value and returns the member's
// bit, 0 for members that may repeat (unknown ones); a known member seen
// twice makes the object fail, since encoding/json would keep the last.
func (d *fastDecoder) object(member func(name []byte) (bit int, ok bool)) bool {
	if d.peek() != '{' {
		return false
	}
	d.i++
	d.ws()
	if d.peek() == '}' {
		d.i++
		return true
	}
	seen := 0
	for {
		name, ok := d.name()
		if !ok {
			return false
		}
		bit, ok := member(name)
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
		if !d.next() {
			return d.closed()
		}
	}
}

// kvObject parses one KV entry, an object, into p.
func (d *fastDecoder) kvObject(p *rawPair) bool {
	p.value.off = -1
	return d.object(func(name []byte) (int, bool) {
		switch string(name) {
		case "LockIndex":
			return fLockIndex, d.uint(&p.lockIndex)
		case "Key":
			return fKey, d.str(&p.key)
		case "Flags":
			return fFlags, d.uint(&p.flags)
		case "Value":
			return fValue, d.base64(&p.value)
		case "Session":
			return fSession, d.str(&p.session)
		case "CreateIndex":
			return fCreateIndex, d.uint(&p.createIndex)
		case "ModifyIndex":
			return fModifyIndex, d.uint(&p.modifyIndex)
		}
		return 0, d.unknown(name, kvFields)
	})
}

// next consumes the white space and comma after a member and reports
// whether another member follows; when it returns false the caller checks
// for the closing brace with closed.
func (d *fastDecoder) next() bool {
	d.ws()
	if d.peek() == ',' {
		d.i++
		d.ws()
		return true
	}
	return false
}

func (d *fastDecoder) closed() bool {
	if d.peek() == '}' {
		d.i++
		return true
	}
	return false
}

// name parses a member name and its colon, leaving d.i at the value. Names
// with escapes or bytes outside printable ASCII are refused.
func (d *fastDecoder) name() ([]byte, bool) {
	if d.peek() != '"' {
		return nil, false
	}
	start := d.i + 1
	for i := start; i < len(d.b); i++ {
		c := d.b[i]
		if plain[c] {
			continue
		}
		if c == '"' {
			name := d.b[start:i]
			d.i = i + 1
			d.ws()
			if d.peek() != ':' {
				return nil, false
			}
			d.i++
			d.ws()
			return name, true
		}
		if c < 0x20 || c >= 0x80 || c == '\\' {
			return nil, false
		}
	}
	return nil, false
}

// unknown skips the value of a member that is none of known. A name that
// matches one of them but for case is refused: encoding/json would take
// it for that field.
func (d *fastDecoder) unknown(name []byte, known []string) bool {
	for _, k := range known {
		if len(k) == len(name) && equalFoldASCII(k, name) {
			return false
		}
	}
	return d.skip()
}

func equalFoldASCII(s string, b []byte) bool {
	for i := 0; i < len(s); i++ {
		x, y := s[i], b[i]
		if 'a' <= x && x <= 'z' {
			x -= 'a' - 'A'
		}
		if 'a' <= y && y <= 'z' {
			y -= 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// maxSkipDepth bounds the nesting of skipped values; deeper ones fall
// back (encoding/json has its own limit).
const maxSkipDepth = 64

// skip consumes any well-formed JSON value.
func (d *fastDecoder) skip() bool {
	switch c := d.peek(); {
	case c == '"':
		var s span
		n := len(d.strs)
		ok := d.str(&s)
		d.strs = d.strs[:n]
		return ok
	case c == '-' || ('0' <= c && c <= '9'):
		return d.number()
	case c == 't':
		return d.lit("true")
	case c == 'f':
		return d.lit("false")
	case c == 'n':
		return d.lit("null")
	case c == '[' || c == '{':
		if d.depth >= maxSkipDepth {
			return false
		}
		d.depth++
		defer func() { d.depth-- }()
		d.i++
		d.ws()
		if c == '[' {
			if d.peek() == ']' {
				d.i++
				return true
			}
			for {
				if !d.skip() {
					return false
				}
				d.ws()
				switch d.peek() {
				case ',':
					d.i++
					d.ws()
				case ']':
					d.i++
					return true
				default:
					return false
				}
			}
		}
		if d.peek() == '}' {
			d.i++
			return true
		}
		for {
			if _, ok := d.name(); !ok || !d.skip() {
				return false
			}
			if !d.next() {
				return d.closed()
			}
		}
	}
	return false
}

// number consumes a JSON number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (d *fastDecoder) number() bool {
	b, i := d.b, d.i
	if i < len(b) && b[i] == '-' {
		i++
	}
	if i >= len(b) {
		return false
	}
	if b[i] == '0' {
		i++
	} else if '1' <= b[i] && b[i] <= '9' {
		i = digits(b, i)
	} else {
		return false
	}
	if i < len(b) && b[i] == '.' {
		j := digits(b, i+1)
		if j == i+1 {
			return false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(b, i)
		if j == i {
			return false
		}
		i = j
	}
	d.i = i
	return true
}

func digits(b []byte, i int) int {
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	return i
}

// uint parses null (leaving *v zero) or a non-negative integer that fits
// in a uint64. A fraction, an exponent or a minus sign is refused: for a
// uint64 field encoding/json reports those as errors.
func (d *fastDecoder) uint(v *uint64) bool {
	if d.lit("null") {
		return true
	}
	b, i := d.b, d.i
	if i >= len(b) {
		return false
	}
	if b[i] == '0' {
		i++
	} else {
		var n uint64
		start := i
		for ; i < len(b) && '0' <= b[i] && b[i] <= '9'; i++ {
			if i-start >= 19 { // 20 digits may overflow: let strconv decide
				var err error
				j := digits(b, i)
				if n, err = strconv.ParseUint(string(b[start:j]), 10, 64); err != nil {
					return false
				}
				i = j
				break
			}
			n = n*10 + uint64(b[i]-'0')
		}
		if i == start {
			return false
		}
		*v = n
	}
	if i < len(b) && (b[i] == '.' || b[i] == 'e' || b[i] == 'E' || ('0' <= b[i] && b[i] <= '9')) {
		return false
	}
	d.i = i
	return true
}

// int parses null (leaving *v zero) or an integer that fits in an int.
func (d *fastDecoder) int(v *int) bool {
	if d.lit("null") {
		return true
	}
	b, i := d.b, d.i
	start := i
	if i < len(b) && b[i] == '-' {
		i++
	}
	if i >= len(b) {
		return false
	}
	if b[i] == '0' {
		i++
	} else {
		j := digits(b, i)
		if j == i {
			return false
		}
		i = j
	}
	if i < len(b) && (b[i] == '.' || b[i] == 'e' || b[i] == 'E' || ('0' <= b[i] && b[i] <= '9')) {
		return false
	}
	n, err := strconv.ParseInt(string(b[start:i]), 10, strconv.IntSize)
	if err != nil {
		return false
	}
	*v = int(n)
	d.i = i
	return true
}

// str parses null (leaving *s empty) or a string, unescaped into d.strs.
// Invalid UTF-8 and surrogate escapes are refused (encoding/json replaces
// them with U+FFFD; that is left to it).
func (d *fastDecoder) str(s *span) bool {
	if d.lit("null") {
		return true
	}
	if d.peek() != '"' {
		return false
	}
	b := d.b
	start := len(d.strs)
	i := d.i + 1
	for {
		j := i
		for j < len(b) && plain[b[j]] {
			j++
		}
		d.strs = append(d.strs, b[i:j]...)
		if j >= len(b) {
			return false
		}
		switch c := b[j]; {
		case c == '"':
			d.i = j + 1
			*s = span{start, len(d.strs) - start}
			return true
		case c < 0x20:
			return false
		case c >= 0x80:
			r, n := utf8.DecodeRune(b[j:])
			if r == utf8.RuneError && n == 1 {
				return false
			}
			d.strs = append(d.strs, b[j:j+n]...)
			i = j + n
		default: // backslash
			if j+1 >= len(b) {
				return false
			}
			i = j + 2
			switch b[j+1] {
			case '"', '\\', '/':
				d.strs = append(d.strs, b[j+1])
			case 'b':
				d.strs = append(d.strs, '\b')
			case 'f':
				d.strs = append(d.strs, '\f')
			case 'n':
				d.strs = append(d.strs, '\n')
			case 'r':
				d.strs = append(d.strs, '\r')
			case 't':
				d.strs = append(d.strs, '\t')
			case 'u':
				if j+6 > len(b) {
					return false
				}
				var r rune
				for _, h := range b[j+2 : j+6] {
					switch {
					case '0' <= h && h <= '9':
						h -= '0'
					case 'a' <= h && h <= 'f':
						h -= 'a' - 10
					case 'A' <= h && h <= 'F':
						h -= 'A' - 10
					default:
						return false
					}
					r = r<<4 | rune(h)
				}
				if 0xD800 <= r && r < 0xE000 {
					return false
				}
				d.strs = utf8.AppendRune(d.strs, r)
				i = j + 6
			default:
				return false
			}
		}
	}
}

// plain is true for the bytes that stand for themselves in a JSON string:
// ASCII but for control characters, '"' and '\\'.
var plain = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// base64 parses null (leaving v.off < 0) or a string of base64 characters,
// recording where it is in d.b; it is decoded when the answer is built.
func (d *fastDecoder) base64(v *span) bool {
	if d.lit("null") {
		return true
	}
	if d.peek() != '"' {
		return false
	}
	b := d.b
	start := d.i + 1
	for i := start; i < len(b); i++ {
		c := b[i]
		if c == '"' {
			*v = span{start, i - start}
			d.i = i + 1
			return true
		}
		if !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '+' || c == '/' || c == '=') {
			return false
		}
	}
	return false
}

// buildPairs makes the KVPairs of d.pairs[from:to], with strs the string
// of d.strs. It fails if a value is not valid base64.
func (d *fastDecoder) buildPairs(from, to int, strs string) (KVPairs, bool) {
	raw := d.pairs[from:to]
	n, total := 0, 0
	for i := range raw {
		if !raw[i].null {
			n++
			if raw[i].value.off >= 0 {
				total += base64.StdEncoding.DecodedLen(raw[i].value.n)
			}
		}
	}
	var vals []byte
	if total > 0 {
		vals = make([]byte, total)
	}
	slab := make([]KVPair, n)
	out := make(KVPairs, len(raw))
	pos := 0
	for i := range raw {
		r := &raw[i]
		if r.null {
			continue
		}
		p := &slab[0]
		slab = slab[1:]
		if !d.fillPair(p, r, strs, vals, &pos) {
			return nil, false
		}
		out[i] = p
	}
	return out, true
}

func (d *fastDecoder) fillPair(p *KVPair, r *rawPair, strs string, vals []byte, pos *int) bool {
	p.LockIndex = r.lockIndex
	p.Key = strs[r.key.off : r.key.off+r.key.n]
	p.Flags = r.flags
	p.Session = strs[r.session.off : r.session.off+r.session.n]
	p.CreateIndex = r.createIndex
	p.ModifyIndex = r.modifyIndex
	if r.value.off >= 0 {
		if r.value.n == 0 {
			p.Value = emptyValue
		} else {
			at := *pos
			n, err := base64.StdEncoding.Decode(vals[at:], d.b[r.value.off:r.value.off+r.value.n])
			if err != nil {
				return false
			}
			p.Value = vals[at : at+n : at+n]
			*pos = at + n
		}
	}
	return true
}

// TxnResponse's fields.
const (
	fResults = 1 << iota
	fErrors
)

var (
	txnFields      = []string{"Results", "Errors"}
	txnResultField = []string{"KV"}
	txnErrorFields = []string{"OpIndex", "What"}
)

// txnResponse parses null (leaving resp zero) or a TxnResponse object.
func (d *fastDecoder) txnResponse(resp *TxnResponse) bool {
	if d.lit("null") {
		return true
	}
	resultsNull, errorsNull := true, true
	if !d.object(func(name []byte) (bit int, ok bool) {
		switch string(name) {
		case "Results":
			resultsNull, ok = d.txnResults()
			return fResults, ok
		case "Errors":
			errorsNull, ok = d.txnErrors()
			return fErrors, ok
		}
		return 0, d.unknown(name, txnFields)
	}) {
		return false
	}
	strs := string(d.strs)
	if !resultsNull {
		pairs, ok := d.buildPairs(0, len(d.pairs), strs)
		if !ok {
			return false
		}
		slab := make([]TxnResult, 0, len(d.results))
		resp.Results = make(TxnResults, len(d.results))
		for i, r := range d.results {
			if r.null {
				continue
			}
			slab = append(slab, TxnResult{})
			res := &slab[len(slab)-1]
			if r.pair >= 0 {
				res.KV = pairs[r.pair]
			}
			resp.Results[i] = res
		}
	}
	if !errorsNull {
		slab := make([]TxnError, 0, len(d.errs))
		resp.Errors = make(TxnErrors, len(d.errs))
		for i, e := range d.errs {
			if e.null {
				continue
			}
			slab = append(slab, TxnError{OpIndex: e.opIndex, What: strs[e.what.off : e.what.off+e.what.n]})
			resp.Errors[i] = &slab[len(slab)-1]
		}
	}
	return true
}

// txnResults parses null or the Results array into d.results, their KV
// entries into d.pairs.
func (d *fastDecoder) txnResults() (null, ok bool) {
	return d.array(func() bool {
		r := rawResult{pair: -1}
		if d.lit("null") {
			r.null = true
		} else if !d.txnResult(&r) {
			return false
		}
		d.results = append(d.results, r)
		return true
	})
}

func (d *fastDecoder) txnResult(r *rawResult) bool {
	return d.object(func(name []byte) (int, bool) {
		if string(name) != "KV" {
			return 0, d.unknown(name, txnResultField)
		}
		if d.lit("null") {
			return 1, true
		}
		var p rawPair
		if !d.kvObject(&p) {
			return 1, false
		}
		r.pair = len(d.pairs)
		d.pairs = append(d.pairs, p)
		return 1, true
	})
}

// txnErrors parses null or the Errors array into d.errs.
func (d *fastDecoder) txnErrors() (null, ok bool) {
	return d.array(func() bool {
		var e rawError
		if d.lit("null") {
			e.null = true
		} else if !d.txnError(&e) {
			return false
		}
		d.errs = append(d.errs, e)
		return true
	})
}

const (
	fOpIndex = 1 << iota
	fWhat
)

func (d *fastDecoder) txnError(e *rawError) bool {
	return d.object(func(name []byte) (int, bool) {
		switch string(name) {
		case "OpIndex":
			return fOpIndex, d.int(&e.opIndex)
		case "What":
			return fWhat, d.str(&e.what)
		}
		return 0, d.unknown(name, txnErrorFields)
	})
}
