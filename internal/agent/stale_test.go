package agent

import (
	"context"
	"strings"
	"testing"

	"github.com/holdfast/holdfast/internal/state"
)

type recordingCatalog struct {
	dereg        []string // check IDs, or service=<id>
	onDeregister func()
}

func (r *recordingCatalog) Register(context.Context, *state.RegisterRequest) error { return nil }
func (r *recordingCatalog) Deregister(_ context.Context, req *state.DeregisterRequest) error {
	if r.onDeregister != nil {
		r.onDeregister()
	}
	if req.ServiceID != "" {
		r.dereg = append(r.dereg, "service="+req.ServiceID)
	} else {
		r.dereg = append(r.dereg, req.CheckID)
	}
	return nil
}

func TestForgetStaleDeregistersOnlyOrphanedAgentChecks(t *testing.T) {
	cat := &recordingCatalog{}
	a := New(Config{Node: "n1", Catalog: cat})
	defer a.Close()
	if err := a.RegisterCheck(context.Background(), &state.CheckDefinition{ID: "live", Name: "live", TTL: 10e9}); err != nil {
		t.Fatal(err)
	}
	err := a.ForgetStale(context.Background(), []*state.HealthCheck{
		{Node: "n1", CheckID: "serfHealth", Status: "passing"},              // gossip's: not ours
		{Node: "n1", CheckID: "manual", Status: "passing"},                  // registered through the catalog API
		{Node: "n1", CheckID: "live", Status: "passing", Type: "ttl"},       // this run knows it
		{Node: "n1", CheckID: "old-ttl", Status: "passing", Type: "ttl"},    // orphaned
		{Node: "n1", CheckID: "old-http", Status: "critical", Type: "http"}, // orphaned
		{Node: "other", CheckID: "theirs", Status: "passing", Type: "ttl"},  // another node's
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(cat.dereg) != 2 || cat.dereg[0] != "old-ttl" || cat.dereg[1] != "old-http" {
		t.Fatalf("deregistered %v, want [old-ttl old-http]", cat.dereg)
	}
}

// A check left by an earlier run that belonged to a service this run does
// not know means that run registered the service too: the service goes
// with it, or it would stay in the catalog with no check, counted as
// healthy, for ever. A known or pending service only loses the check.
func TestForgetStaleDropsServicesOfStaleChecks(t *testing.T) {
	cat := &recordingCatalog{}
	a := New(Config{Node: "n1", Catalog: cat})
	defer a.Close()
	if err := a.RegisterService(context.Background(), &state.Service{Service: "live"}, nil, false); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	a.pending = &savedState{Version: stateVersion, Services: []*state.Service{{ID: "later", Service: "later"}}}
	a.mu.Unlock()
	err := a.ForgetStale(context.Background(), []*state.HealthCheck{
		{Node: "n1", CheckID: "service:old", ServiceID: "old", Type: "ttl"},
		{Node: "n1", CheckID: "service:old:2", ServiceID: "old", Type: "http"},
		{Node: "n1", CheckID: "gone", ServiceID: "live", Type: "ttl"},
		{Node: "n1", CheckID: "gone2", ServiceID: "later", Type: "tcp"},
		{Node: "n1", CheckID: "manual", ServiceID: "api"}, // the catalog API's
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cat.dereg, " "); got != "service=old gone gone2" {
		t.Fatalf("deregistered %s, want service=old gone gone2", got)
	}
}

// ForgetStale holds the registry still while it writes: a check
// registered meanwhile (an application registering its check as the agent
// starts) is not deregistered as stale on the strength of a list read
// before it existed.
func TestForgetStaleHoldsRegistrations(t *testing.T) {
	var a *Agent
	var held []bool
	cat := &recordingCatalog{onDeregister: func() {
		locked := a.regMu.TryLock()
		if locked {
			a.regMu.Unlock()
		}
		held = append(held, !locked)
	}}
	a = New(Config{Node: "n1", Catalog: cat})
	defer a.Close()
	err := a.ForgetStale(context.Background(), []*state.HealthCheck{
		{Node: "n1", CheckID: "x", Type: "ttl"},
		{Node: "n1", CheckID: "y", Type: "ttl"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(held) != 2 || !held[0] || !held[1] {
		t.Fatalf("registry held during the deregistrations: %v", held)
	}
}
