package api

import (
	"context"
	"net/http"
	"net/url"
)

// Operator is the operator endpoint, /v1/operator: the servers' raft
// configuration. Get one with Client.Operator.
type Operator struct{ c *Client }

// Operator returns the operator endpoint.
func (c *Client) Operator() *Operator { return &Operator{c} }

// RaftServer is one server of the raft configuration.
type RaftServer struct {
	// ID is the server's raft ID, its node name.
	ID string
	// Node is the server's node name.
	Node string
	// Address is where raft reaches the server (host:port).
	Address string
	// Leader is true for the current leader.
	Leader bool
	// ProtocolVersion is the raft protocol the server speaks ("3").
	ProtocolVersion string
	// Voter is true for a server that votes; false for one that only
	// receives the log.
	Voter bool
}

// RaftConfiguration is the raft configuration, and the log index it was
// written at.
type RaftConfiguration struct {
	Servers []*RaftServer
	Index   uint64
}

// RaftGetConfiguration returns the raft configuration. By default the
// leader answers; with q.AllowStale the agent's server answers from what
// it knows.
func (o *Operator) RaftGetConfiguration(ctx context.Context, q *QueryOptions) (*RaftConfiguration, error) {
	var out RaftConfiguration
	if _, err := o.c.query(ctx, "/v1/operator/raft/configuration", nil, q, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// RaftRemovePeerByID takes the server with raft ID id out of the raft
// configuration: for a server that is gone for good.
func (o *Operator) RaftRemovePeerByID(ctx context.Context, id string, w *WriteOptions) error {
	return o.removePeer(ctx, url.Values{"id": {id}}, w)
}

// RaftRemovePeerByAddress takes the server at address (host:port) out of
// the raft configuration.
func (o *Operator) RaftRemovePeerByAddress(ctx context.Context, address string, w *WriteOptions) error {
	return o.removePeer(ctx, url.Values{"address": {address}}, w)
}

func (o *Operator) removePeer(ctx context.Context, params url.Values, w *WriteOptions) error {
	r := o.c.newRequest(http.MethodDelete, "/v1/operator/raft/peer")
	for k, v := range params {
		r.params[k] = v
	}
	_, err := o.c.write(ctx, r, w, nil)
	return err
}
