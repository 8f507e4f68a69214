package state_test

import (
	"reflect"
	"testing"

	"github.com/holdfast/holdfast/internal/state"
	"github.com/holdfast/holdfast/internal/watch"
)

// svcFx is newFx plus web on n1 (two instances, one with a passing check,
// one with a warning check) and on n2 (a critical check), and db on n2.
func svcFx(t *testing.T) *fx {
	f := newFx(t)
	f.register(&state.RegisterRequest{Node: "n1", SkipNodeUpdate: true,
		Service: &state.Service{ID: "web1", Service: "web", Tags: []string{"v1", "primary"}, Port: 80},
		Check:   &state.HealthCheck{CheckID: "web1-http", ServiceID: "web1", Status: state.HealthPassing}})
	f.register(&state.RegisterRequest{Node: "n1", SkipNodeUpdate: true,
		Service: &state.Service{ID: "web2", Service: "web", Tags: []string{"v2"}, Port: 81},
		Check:   &state.HealthCheck{CheckID: "web2-http", ServiceID: "web2", Status: state.HealthWarning}})
	f.register(&state.RegisterRequest{Node: "n2", SkipNodeUpdate: true,
		Service: &state.Service{ID: "web", Service: "web", Tags: []string{"v1"}, Port: 80},
		Check:   &state.HealthCheck{CheckID: "web-tcp", ServiceID: "web", Status: state.HealthCritical}})
	f.register(&state.RegisterRequest{Node: "n2", SkipNodeUpdate: true,
		Service: &state.Service{ID: "db", Service: "db"}})
	return f
}

func checkIDs(cs []*state.HealthCheck) []string {
	out := []string{}
	for _, c := range cs {
		out = append(out, c.Node+"/"+c.CheckID)
	}
	return out
}

func TestServices(t *testing.T) {
	f := svcFx(t)
	idx, got := f.s.Services(nil)
	want := map[string][]string{"web": {"v1", "primary", "v2"}, "db": {}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Services = %v, want %v", got, want)
	}
	if idx != f.idx {
		t.Fatalf("index %d, want %d (the last write touched services)", idx, f.idx)
	}
}

func TestServiceNodesAndHealth(t *testing.T) {
	f := svcFx(t)
	_, sn := f.s.ServiceNodes(nil, "WEB") // names match case-insensitively
	var got []string
	for _, x := range sn {
		got = append(got, x.Node.Node+"/"+x.Service.ID+"@"+x.Node.Address)
	}
	if want := []string{"n1/web1@10.0.0.1", "n1/web2@10.0.0.1", "n2/web@10.0.0.2"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("ServiceNodes = %v, want %v", got, want)
	}

	_, csn := f.s.CheckServiceNodes(nil, "web")
	if len(csn) != 3 {
		t.Fatalf("CheckServiceNodes: %d instances", len(csn))
	}
	// n1 carries serfHealth, c1, c2 as node checks; each instance gets
	// those and only its own service check.
	if got, want := checkIDs(csn[0].Checks), []string{"n1/c1", "n1/c2", "n1/serfHealth", "n1/web1-http"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("web1 checks %v, want %v", got, want)
	}
	if got, want := checkIDs(csn[1].Checks), []string{"n1/c1", "n1/c2", "n1/serfHealth", "n1/web2-http"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("web2 checks %v, want %v", got, want)
	}
	healthy := func(onlyPassing bool) []bool {
		var out []bool
		for _, x := range csn {
			out = append(out, x.Healthy(onlyPassing))
		}
		return out
	}
	if got, want := healthy(false), []bool{true, true, false}; !reflect.DeepEqual(got, want) {
		t.Fatalf("Healthy(false) = %v, want %v", got, want)
	}
	if got, want := healthy(true), []bool{true, false, false}; !reflect.DeepEqual(got, want) {
		t.Fatalf("Healthy(true) = %v, want %v", got, want)
	}

	// A node check going critical makes every instance on it unhealthy.
	f.check("n1", "c1", state.HealthCritical)
	_, csn = f.s.CheckServiceNodes(nil, "web")
	if csn[0].Healthy(false) || csn[1].Healthy(false) {
		t.Fatal("instances on a node with a critical node check are healthy")
	}

	if _, none := f.s.CheckServiceNodes(nil, "nope"); none == nil || len(none) != 0 {
		t.Fatalf("unknown service: %v, want empty and not nil", none)
	}
}

func TestServiceChecksAndChecksInState(t *testing.T) {
	f := svcFx(t)
	_, cs := f.s.ServiceChecks(nil, "web")
	if got, want := checkIDs(cs), []string{"n1/web1-http", "n1/web2-http", "n2/web-tcp"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("ServiceChecks = %v, want %v", got, want)
	}
	cases := map[string][]string{
		state.HealthCritical: {"n2/web-tcp"},
		state.HealthWarning:  {"n1/web2-http"},
		state.HealthPassing:  {"n1/c1", "n1/c2", "n1/serfHealth", "n1/web1-http", "n2/serfHealth"},
		state.HealthAny:      {"n1/c1", "n1/c2", "n1/serfHealth", "n1/web1-http", "n1/web2-http", "n2/serfHealth", "n2/web-tcp"},
		"bogus":              {},
	}
	for st, want := range cases {
		idx, cs := f.s.ChecksInState(nil, st)
		if got := checkIDs(cs); !reflect.DeepEqual(got, want) {
			t.Errorf("ChecksInState(%s) = %v, want %v", st, got, want)
		}
		if idx != f.s.TableIndex("checks") {
			t.Errorf("ChecksInState(%s) index %d, want the checks table's", st, idx)
		}
	}
}

// A blocking reader of a service's health wakes when one of its checks
// changes, and not when a check of an unrelated node changes.
func TestCheckServiceNodesWatch(t *testing.T) {
	f := svcFx(t)
	ws := watch.NewSet()
	f.s.CheckServiceNodes(ws, "db")
	f.check("n1", "c2", state.HealthWarning) // n1 runs no db
	if fired(ws) {
		t.Fatal("woke on a check of a node the service does not run on")
	}
	f.check("n2", state.SerfCheckID, state.HealthWarning)
	if !fired(ws) {
		t.Fatal("did not wake when the node of an instance changed health")
	}

	ws = watch.NewSet()
	f.s.CheckServiceNodes(ws, "db")
	f.deregister(&state.DeregisterRequest{Node: "n2", ServiceID: "db"})
	if !fired(ws) {
		t.Fatal("did not wake when the instance was deregistered")
	}
	if _, csn := f.s.CheckServiceNodes(nil, "db"); len(csn) != 0 {
		t.Fatalf("deregistered instance still listed: %v", csn)
	}
}
