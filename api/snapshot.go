package api

import (
	"context"
	"io"
	"net/http"
)

// Snapshot reaches /v1/snapshot: backups of the whole server state.
type Snapshot struct{ c *Client }

// Snapshot returns the handle for the snapshot endpoints.
func (c *Client) Snapshot() *Snapshot { return &Snapshot{c} }

// Save takes a snapshot and returns its archive as a stream, which the
// caller must close, and the index it holds (QueryMeta.LastIndex). Only
// Datacenter, AllowStale and the client's token apply.
func (s *Snapshot) Save(ctx context.Context, q *QueryOptions) (io.ReadCloser, *QueryMeta, error) {
	r := s.c.newRequest(http.MethodGet, "/v1/snapshot")
	if err := s.c.setQueryOptions(r, q); err != nil {
		return nil, nil, err
	}
	resp, rtt, err := s.c.do(ctx, r)
	if err != nil {
		return nil, nil, err
	}
	qm := &QueryMeta{RequestTime: rtt}
	if err := parseQueryMeta(resp.Header, qm); err != nil {
		closeBody(resp)
		return nil, nil, err
	}
	return resp.Body, qm, nil
}

// Restore replaces the server's whole state with the archive read from in,
// which Save gave.
func (s *Snapshot) Restore(ctx context.Context, w *WriteOptions, in io.Reader) error {
	r := s.c.newRequest(http.MethodPut, "/v1/snapshot")
	r.body = in
	r.contentType = "application/octet-stream"
	_, err := s.c.write(ctx, r, w, nil)
	return err
}
