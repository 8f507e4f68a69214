package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/holdfast/holdfast/internal/state"
)

// Kind classifies an error at the edge of the HTTP API. Every error a
// handler returns is given exactly one Kind, and statusOf is the one table
// from Kind to HTTP status.
type Kind int

// Error kinds.
const (
	// KindInternal is anything not classified otherwise: a bug or an
	// unexpected failure of the backend.
	KindInternal Kind = iota
	// KindInvalid is a bad request: the client must fix it, not retry it.
	KindInvalid
	// KindNotFound names something that does not exist.
	KindNotFound
	// KindConflict is a transaction that was rolled back.
	KindConflict
	// KindTooLarge is a request body or transaction above a limit.
	KindTooLarge
	// KindMethodNotAllowed is a known path with the wrong method.
	KindMethodNotAllowed
	// KindPermissionDenied is an ACL refusal (unused until ACLs exist).
	KindPermissionDenied
	// KindUnavailable is transient server trouble (no leader, shutting
	// down). It is 500 on purpose: Consul's clients retry on 500 only.
	KindUnavailable
	// KindNotImplemented is an endpoint holdfast knows but does not serve yet.
	KindNotImplemented
)

// statusOf maps each Kind to its HTTP status.
var statusOf = map[Kind]int{
	KindInternal:         http.StatusInternalServerError,
	KindInvalid:          http.StatusBadRequest,
	KindNotFound:         http.StatusNotFound,
	KindConflict:         http.StatusConflict,
	KindTooLarge:         http.StatusRequestEntityTooLarge,
	KindMethodNotAllowed: http.StatusMethodNotAllowed,
	KindPermissionDenied: http.StatusForbidden,
	KindUnavailable:      http.StatusInternalServerError,
	KindNotImplemented:   http.StatusNotImplemented,
}

// Error is an error raised by the HTTP layer itself, with its Kind and the
// sentence sent to the client as the body.
type Error struct {
	Kind Kind
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

func invalidf(format string, args ...interface{}) error {
	return &Error{Kind: KindInvalid, Msg: fmt.Sprintf(format, args...)}
}

func notFoundf(format string, args ...interface{}) error {
	return &Error{Kind: KindNotFound, Msg: fmt.Sprintf(format, args...)}
}

// errNoLeader is what a non-stale read answers while no leader is known.
var errNoLeader = &Error{Kind: KindUnavailable, Msg: "No cluster leader"}

// badInput are the state errors that mean the request itself was wrong.
// Consul answers most of them with 500; holdfast answers 400 so that a
// client does not retry a request that can never succeed.
var badInput = []error{
	state.ErrInvalidRequest,
	state.ErrMissingKey,
	state.ErrMissingSession,
	state.ErrInvalidSession,
	state.ErrMissingNode,
	state.ErrMissingCheck,
	state.ErrCriticalCheck,
}

var notFound = []error{
	state.ErrQueryNotFound,
	state.ErrSessionNotFound,
}

// KindOf classifies err.
func KindOf(err error) Kind {
	var he *Error
	if errors.As(err, &he) {
		return he.Kind
	}
	for _, s := range badInput {
		if errors.Is(err, s) {
			return KindInvalid
		}
	}
	for _, s := range notFound {
		if errors.Is(err, s) {
			return KindNotFound
		}
	}
	var bi BadInput
	if errors.As(err, &bi) && bi.BadInput() {
		return KindInvalid
	}
	var t Temporary
	if errors.As(err, &t) && t.Temporary() {
		return KindUnavailable
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return KindUnavailable
	}
	return KindInternal
}

// StatusOf is the HTTP status for err.
func StatusOf(err error) int { return statusOf[KindOf(err)] }

// messageOf is the body sent for err: its text, less the "invalid request: "
// the state package puts before the sentence when it wraps that sentinel.
func messageOf(err error) string {
	msg := err.Error()
	if p := state.ErrInvalidRequest.Error() + ": "; strings.HasPrefix(msg, p) && len(msg) > len(p) {
		msg = msg[len(p):]
	}
	return msg
}
