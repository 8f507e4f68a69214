package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// Operator is the operator endpoint, /v1/operator: the servers' raft
// configuration and autopilot's view of their health. Get one with
// Client.Operator.
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

// AutopilotConfiguration is the servers' autopilot behaviour in Consul's
// terms. holdfast's is fixed: a dead server is removed when a new one is
// promoted, a new server is promoted as soon as its log has caught up, and
// health is judged with the thresholds below.
type AutopilotConfiguration struct {
	CleanupDeadServers bool
	// LastContactThreshold is how long a server may go without hearing
	// from the leader and stay healthy.
	LastContactThreshold time.Duration
	// MaxTrailingLogs is how many log entries a server may be behind the
	// leader and stay healthy.
	MaxTrailingLogs uint64
	MinQuorum       uint
	// ServerStabilizationTime is how long a new server must be healthy
	// before it is promoted.
	ServerStabilizationTime time.Duration
	RedundancyZoneTag       string
	DisableUpgradeMigration bool
	UpgradeVersionTag       string
}

// AutopilotGetConfiguration returns the autopilot settings.
func (o *Operator) AutopilotGetConfiguration(ctx context.Context, q *QueryOptions) (*AutopilotConfiguration, error) {
	var wire struct {
		AutopilotConfiguration
		LastContactThreshold, ServerStabilizationTime string
	}
	if _, err := o.c.query(ctx, "/v1/operator/autopilot/configuration", nil, q, &wire); err != nil {
		return nil, err
	}
	out := wire.AutopilotConfiguration
	var err error
	if out.LastContactThreshold, err = time.ParseDuration(wire.LastContactThreshold); err != nil {
		return nil, fmt.Errorf("LastContactThreshold: %v", err)
	}
	if out.ServerStabilizationTime, err = time.ParseDuration(wire.ServerStabilizationTime); err != nil {
		return nil, fmt.Errorf("ServerStabilizationTime: %v", err)
	}
	return &out, nil
}

// ServerHealth is one server's health as the leader judges it.
type ServerHealth struct {
	ID, Name, Address string
	// SerfStatus is the server's state in the gossip pool: alive, failed,
	// left, leaving or none.
	SerfStatus string
	Version    string
	Leader     bool
	// LastContact is the time since the server last heard from the
	// leader; negative when unknown (it could not be asked, or never
	// heard from a leader).
	LastContact         time.Duration
	LastTerm, LastIndex uint64
	Healthy, Voter      bool
	// StableSince is when the leader first saw the server as healthy (or
	// unhealthy) as it is now.
	StableSince time.Time
}

// OperatorHealthReply is the health of every server of the raft
// configuration.
type OperatorHealthReply struct {
	// Healthy is true when every server is.
	Healthy bool
	// FailureTolerance is how many voters could fail with the cluster
	// still taking writes.
	FailureTolerance int
	Servers          []ServerHealth
}

// AutopilotServerHealth returns the servers' health, as the leader judges
// it. An unhealthy cluster is an answer too (the server says so with 429).
func (o *Operator) AutopilotServerHealth(ctx context.Context, q *QueryOptions) (*OperatorHealthReply, error) {
	type wireServer struct {
		ServerHealth
		LastContact *string
	}
	var wire struct {
		Healthy          bool
		FailureTolerance int
		Servers          []wireServer
	}
	_, err := o.c.query(ctx, "/v1/operator/autopilot/health", nil, q, &wire)
	var se *StatusError
	if errors.As(err, &se) && se.Code == http.StatusTooManyRequests {
		err = json.Unmarshal([]byte(se.Body), &wire)
	}
	if err != nil {
		return nil, err
	}
	out := &OperatorHealthReply{Healthy: wire.Healthy, FailureTolerance: wire.FailureTolerance}
	for _, ws := range wire.Servers {
		s := ws.ServerHealth
		s.LastContact = -1
		if ws.LastContact != nil {
			if s.LastContact, err = time.ParseDuration(*ws.LastContact); err != nil {
				return nil, fmt.Errorf("server %s's LastContact: %v", s.Name, err)
			}
		}
		out.Servers = append(out.Servers, s)
	}
	return out, nil
}

// RaftLeaderTransfer hands the leadership to the server with raft ID id
// (its node name), or, with id empty, to the most up-to-date follower. It
// returns once the leader has stepped down for it.
func (o *Operator) RaftLeaderTransfer(ctx context.Context, id string, q *QueryOptions) (*TransferLeaderResponse, error) {
	r := o.c.newRequest(http.MethodPost, "/v1/operator/raft/transfer-leader")
	if id != "" {
		r.params.Set("id", id)
	}
	if err := o.c.setQueryOptions(r, q); err != nil {
		return nil, err
	}
	var out TransferLeaderResponse
	if _, err := o.c.write(ctx, r, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// TransferLeaderResponse is the answer to RaftLeaderTransfer.
type TransferLeaderResponse struct {
	Success bool
}
