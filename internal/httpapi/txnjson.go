package httpapi

import (
	"encoding/base64"
	"encoding/json"
	"strings"
)

// fastTxnBody decodes a PUT /v1/txn body of the shape Go clients send
// (holdfast's and Consul's: json.Marshal of their op structs) into what
// decodeStrict makes of it, without encoding/json's reflection, which was
// most of a transaction's decoding cost. It declines (ok false, having
// decided nothing) whatever it does not recognise for sure: a field name
// not spelt exactly, a repeated field, a string with an escape, a control
// character or a non-ASCII byte, a number that is not a plain unsigned
// integer, a null where a string or a number belongs, a non-null Node,
// Service or Check, a null operation, anything after the array. The
// caller then decodes with encoding/json, which also makes every error.
// FuzzFastTxnBody holds the two to the same answer.
func fastTxnBody(b []byte) (in []*txnOpBody, ok bool) {
	s := txnScan{b: b}
	s.ws()
	if !s.byte('[') {
		return nil, false
	}
	in = make([]*txnOpBody, 0, 8)
	s.ws()
	if s.byte(']') {
		return in, s.end()
	}
	for {
		s.ws()
		op, ok := s.op()
		if !ok {
			return nil, false
		}
		in = append(in, op)
		s.ws()
		if s.byte(']') {
			return in, s.end()
		}
		if !s.byte(',') {
			return nil, false
		}
	}
}

// jsonNull is what encoding/json leaves in a json.RawMessage for null.
var jsonNull = json.RawMessage("null")

// txnScan is a cursor over a transaction body.
type txnScan struct {
	b []byte
	i int
}

// ws skips JSON white space.
func (s *txnScan) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// byte consumes c if it is next.
func (s *txnScan) byte(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// null consumes the literal null if it is next.
func (s *txnScan) null() bool {
	if b := s.b[s.i:]; len(b) >= 4 && b[0] == 'n' && b[1] == 'u' && b[2] == 'l' && b[3] == 'l' {
		s.i += 4
		return true
	}
	return false
}

// end reports whether only white space is left.
func (s *txnScan) end() bool {
	s.ws()
	return s.i == len(s.b)
}

// str reads a string with no escapes, control characters or non-ASCII
// bytes: one that encoding/json takes byte for byte.
func (s *txnScan) str() (string, bool) {
	b, ok := s.raw()
	return string(b), ok
}

// raw is str without the copy: the string's bytes in the body.
func (s *txnScan) raw() ([]byte, bool) {
	if !s.byte('"') {
		return nil, false
	}
	start := s.i
	for ; s.i < len(s.b); s.i++ {
		switch c := s.b[s.i]; {
		case c == '"':
			s.i++
			return s.b[start : s.i-1], true
		case c == '\\' || c < 0x20 || c >= 0x80:
			return nil, false
		}
	}
	return nil, false
}

// uint reads an unsigned integer in JSON's form (no sign, fraction,
// exponent or leading zero) that fits in 64 bits.
func (s *txnScan) uint() (uint64, bool) {
	start := s.i
	var v uint64
	for ; s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9'; s.i++ {
		d := uint64(s.b[s.i] - '0')
		if v > (1<<64-1-d)/10 {
			return 0, false
		}
		v = v*10 + d
	}
	n := s.i - start
	if n == 0 || (n > 1 && s.b[start] == '0') {
		return 0, false
	}
	if s.i < len(s.b) {
		switch s.b[s.i] {
		case '.', 'e', 'E':
			return 0, false
		}
	}
	return v, true
}

// object is the state of reading an object's members with field.
type object struct {
	fields []string
	seen   uint32
	open   bool
}

// field reads up to the value of the object's next member: it returns the
// member's index in o.fields with the cursor at its value, or done at the
// end of the object, or ok false to decline. The first call reads the
// '{'. A name given twice, or one that encoding/json would match to a
// field without its exact spelling, declines: names must be spelt as in
// fields, and any other name must not fold to one of them. Members of
// other names are skipped if their value is null (encoding/json skips any
// value; a client that knows more kinds of operation than holdfast sends
// the unused ones as null) and decline otherwise.
func (s *txnScan) field(o *object) (j int, done, ok bool) {
	for {
		s.ws()
		if !o.open {
			if !s.byte('{') {
				return 0, false, false
			}
			o.open = true
			s.ws()
			if s.byte('}') {
				return 0, true, true
			}
		} else {
			if s.byte('}') {
				return 0, true, true
			}
			if !s.byte(',') {
				return 0, false, false
			}
			s.ws()
		}
		name, ok := s.raw()
		if !ok {
			return 0, false, false
		}
		s.ws()
		if !s.byte(':') {
			return 0, false, false
		}
		s.ws()
		for j, f := range o.fields {
			if string(name) == f {
				if o.seen&(1<<j) != 0 {
					return 0, false, false
				}
				o.seen |= 1 << j
				return j, false, true
			}
			if strings.EqualFold(string(name), f) {
				return 0, false, false
			}
		}
		if !s.null() {
			return 0, false, false
		}
	}
}

// The fields of an operation and of its KV part, by index.
var (
	txnOpFields = []string{"KV", "Node", "Service", "Check"}
	txnKVFields = []string{"Verb", "Key", "Value", "Flags", "Index", "Session", "LockIndex", "Namespace", "Partition"}
)

// op reads one element of the array: an object, not null.
func (s *txnScan) op() (*txnOpBody, bool) {
	// One allocation for the operation and its KV part.
	both := &struct {
		op txnOpBody
		kv txnKVOp
	}{}
	op := &both.op
	o := object{fields: txnOpFields}
	for {
		j, done, ok := s.field(&o)
		switch {
		case !ok:
			return nil, false
		case done:
			return op, true
		case j == 0: // KV
			if s.null() {
				continue
			}
			op.KV = &both.kv
			if !s.kv(op.KV) {
				return nil, false
			}
		case !s.null():
			// Node, Service, Check: only null, which decodeTxn allows.
			return nil, false
		case j == 1:
			op.Node = jsonNull
		case j == 2:
			op.Service = jsonNull
		default:
			op.Check = jsonNull
		}
	}
}

// kv reads the KV part of an operation.
func (s *txnScan) kv(kv *txnKVOp) bool {
	o := object{fields: txnKVFields}
	for {
		j, done, ok := s.field(&o)
		if !ok || done {
			return ok
		}
		switch txnKVFields[j] {
		case "Verb":
			var v []byte
			if v, ok = s.raw(); ok {
				// A known verb is decodeTxn's string, not a copy.
				if tv, known := txnVerbs[string(v)]; known {
					kv.Verb = tv.name
				} else {
					kv.Verb = string(v)
				}
			}
		case "Key":
			kv.Key, ok = s.str()
		case "Session":
			kv.Session, ok = s.str()
		case "Namespace":
			kv.Namespace, ok = s.str()
		case "Partition":
			kv.Partition, ok = s.str()
		case "Flags":
			kv.Flags, ok = s.uint()
		case "Index":
			kv.Index, ok = s.uint()
		case "LockIndex":
			kv.LockIndex, ok = s.uint()
		case "Value":
			if s.null() {
				continue
			}
			var v []byte
			if v, ok = s.raw(); !ok {
				return false
			}
			// As encoding/json decodes a []byte: standard base64, an
			// empty string giving an empty, not nil, slice.
			kv.Value = make([]byte, base64.StdEncoding.DecodedLen(len(v)))
			n, err := base64.StdEncoding.Decode(kv.Value, v)
			kv.Value = kv.Value[:n]
			ok = err == nil
		}
		if !ok {
			return false
		}
	}
}
