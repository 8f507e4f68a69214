package httpapi

import (
	"context"
	"io"
	"net/http"
)

// Snapshotter is what /v1/snapshot needs of a Backend. A Backend without
// it answers 501 there.
type Snapshotter interface {
	// SaveSnapshot returns the raft index a new snapshot holds and a
	// stream of its archive, which the caller closes.
	SaveSnapshot() (uint64, io.ReadCloser, error)
	// RestoreSnapshot replaces the state with an archive's. An archive
	// that cannot be restored is an error implementing BadInput; ctx ends
	// with the request, and a restore not begun by then is not.
	RestoreSnapshot(ctx context.Context, archive io.Reader) error
}

func (h *handler) snapshotter() (Snapshotter, error) {
	sn, ok := h.b.(Snapshotter)
	if !ok {
		return nil, &Error{Kind: KindNotImplemented, Msg: "this agent takes no snapshots"}
	}
	return sn, nil
}

// snapshotSave is GET /v1/snapshot: the archive, streamed, with the
// snapshot's index in X-Consul-Index.
func (h *handler) snapshotSave(w http.ResponseWriter, r *http.Request, _ string) error {
	sn, err := h.snapshotter()
	if err != nil {
		return err
	}
	ro, err := h.parseRead(query(r))
	if err != nil {
		return err
	}
	index, rc, err := sn.SaveSnapshot()
	if err != nil {
		return err
	}
	defer rc.Close()
	h.setReadHeaders(w, index, ro.mode)
	w.Header().Set("Content-Type", "application/x-gzip")
	// Past the header, a failure can only cut the stream short: the
	// archive's gzip and SHA-256 sums make a cut one fail its restore.
	if _, err := io.Copy(w, rc); err != nil {
		h.opts.Logger.Warn("sending a snapshot failed", "error", err)
	}
	return nil
}

// snapshotRestore is PUT /v1/snapshot: the body is an archive that GET
// gave; the answer is empty.
func (h *handler) snapshotRestore(w http.ResponseWriter, r *http.Request, _ string) error {
	sn, err := h.snapshotter()
	if err != nil {
		return err
	}
	if err := sn.RestoreSnapshot(r.Context(), r.Body); err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}
