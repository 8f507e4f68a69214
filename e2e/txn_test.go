package e2e

import (
	"testing"

	"github.com/hashicorp/consul/api"
)

// A write guarded by check-session commits for the lock holder and never
// for anyone else, through Consul's own client: the whole transaction is
// refused, and the guarded key is untouched.
func TestTxnGuardedByCheckSession(t *testing.T) {
	t.Parallel()
	a := startAgent(t, agentOpts{dev: true})
	c := a.client()
	holder, _, err := c.Session().CreateNoChecks(&api.SessionEntry{Name: "holder"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	other, _, err := c.Session().CreateNoChecks(&api.SessionEntry{Name: "other"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ok, _, err := c.KV().Acquire(&api.KVPair{Key: "svc/leader", Session: holder}, nil); err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	guarded := func(sess, value string) (bool, *api.KVTxnResponse) {
		ok, resp, _, err := c.KV().Txn(api.KVTxnOps{
			{Verb: api.KVCheckSession, Key: "svc/leader", Session: sess},
			{Verb: api.KVSet, Key: "svc/config", Value: []byte(value)},
		}, nil)
		if err != nil {
			t.Fatalf("txn as %s: %v", sess, err)
		}
		return ok, resp
	}

	ok, resp := guarded(other, "from-the-non-holder")
	if ok || len(resp.Errors) != 1 || resp.Errors[0].OpIndex != 0 {
		t.Fatalf("non-holder's guarded txn: ok=%v errors=%+v", ok, resp.Errors)
	}
	if p, _, err := c.KV().Get("svc/config", nil); err != nil || p != nil {
		t.Fatalf("the non-holder's write landed: %+v %v", p, err)
	}

	if ok, resp := guarded(holder, "from-the-holder"); !ok {
		t.Fatalf("holder's guarded txn refused: %+v", resp.Errors)
	}
	p, _, err := c.KV().Get("svc/config", nil)
	if err != nil || p == nil || string(p.Value) != "from-the-holder" {
		t.Fatalf("svc/config = %+v, %v", p, err)
	}

	// Once the holder's session is gone, its guard fails too.
	if _, err := c.Session().Destroy(holder, nil); err != nil {
		t.Fatal(err)
	}
	if ok, _ := guarded(holder, "after-destroy"); ok {
		t.Fatal("a destroyed session's guarded txn committed")
	}
	if p, _, _ := c.KV().Get("svc/config", nil); p == nil || string(p.Value) != "from-the-holder" {
		t.Fatalf("svc/config changed after the guard failed: %+v", p)
	}
}
