package server

import (
	"fmt"
	"strings"

	"github.com/holdfast/holdfast/internal/state"
)

// Names and IDs may not hold a NUL byte. The catalog's and the sessions'
// indexes join their parts with NUL and look them up by prefix, so a node
// named "a\x00b" would be found under node "a": deregistering "a" would
// invalidate the sessions of "a\x00b", and a query named "q\x00x" would
// answer for "q". The propose path refuses such names before raft sees
// them, so the state machine, and every log already written, stays as it
// was.

// nulFree returns an error naming the first of fields (pairs of what and
// value) whose value holds a NUL byte, or nil.
func nulFree(fields ...string) error {
	for i := 0; i+1 < len(fields); i += 2 {
		if strings.IndexByte(fields[i+1], 0) >= 0 {
			return fmt.Errorf("%w: %s %q contains a NUL byte, which names and IDs may not", state.ErrInvalidRequest, fields[i], fields[i+1])
		}
	}
	return nil
}

func checkRegisterNames(req *state.RegisterRequest) error {
	if err := nulFree("Node", req.Node); err != nil {
		return err
	}
	if svc := req.Service; svc != nil {
		if err := nulFree("Service.ID", svc.ID, "Service.Service", svc.Service); err != nil {
			return err
		}
	}
	for _, c := range req.AllChecks() {
		if c == nil {
			continue
		}
		if err := nulFree("CheckID", c.CheckID, "Check.Name", c.Name, "Check.ServiceID", c.ServiceID); err != nil {
			return err
		}
	}
	return nil
}

func checkDeregisterNames(req *state.DeregisterRequest) error {
	return nulFree("Node", req.Node, "ServiceID", req.ServiceID, "CheckID", req.CheckID)
}

func checkSessionNames(sess *state.Session) error {
	if err := nulFree("Node", sess.Node); err != nil {
		return err
	}
	for _, c := range sess.NodeChecks {
		if err := nulFree("check ID", c); err != nil {
			return err
		}
	}
	for _, c := range sess.ServiceChecks {
		if err := nulFree("check ID", c.ID); err != nil {
			return err
		}
	}
	return nil
}

func checkQueryNames(q *state.PreparedQuery) error {
	return nulFree("Name", q.Name, "Service.Service", q.Service.Service, "Session", q.Session)
}
