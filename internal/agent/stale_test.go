package agent

import (
	"context"
	"testing"

	"github.com/holdfast/holdfast/internal/state"
)

type recordingCatalog struct{ dereg []string }

func (r *recordingCatalog) Register(context.Context, *state.RegisterRequest) error { return nil }
func (r *recordingCatalog) Deregister(_ context.Context, req *state.DeregisterRequest) error {
	r.dereg = append(r.dereg, req.CheckID)
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
