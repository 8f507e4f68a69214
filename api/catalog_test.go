package api

import (
	"context"
	"reflect"
	"testing"
)

func TestCatalogRegisterBody(t *testing.T) {
	tests := []struct {
		name     string
		reg      *CatalogRegistration
		wantBody string
	}{
		{"node with one check", &CatalogRegistration{Node: "n1", Address: "10.0.0.1",
			Check: &HealthCheck{Node: "n1", CheckID: "disk", Name: "Disk", Status: HealthPassing}},
			`{"Node":"n1","Address":"10.0.0.1","Check":{"Node":"n1","CheckID":"disk","Name":"Disk","Status":"passing",` +
				`"Notes":"","Output":"","ServiceID":"","ServiceName":"","ServiceTags":null,"Type":"","Definition":{},` +
				`"CreateIndex":0,"ModifyIndex":0}}`},
		{"node only", &CatalogRegistration{Node: "n2", Address: "10.0.0.2"}, `{"Node":"n2","Address":"10.0.0.2"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, c := newStub(t, nil)
			if _, err := c.Catalog().Register(context.Background(), tt.reg, nil); err != nil {
				t.Fatal(err)
			}
			req := st.last(t)
			if req.Method != "PUT" || req.Path != "/v1/catalog/register" {
				t.Errorf("request = %s %s", req.Method, req.Path)
			}
			if req.Body != tt.wantBody {
				t.Errorf("body = %s\nwant   %s", req.Body, tt.wantBody)
			}
		})
	}
}

func TestCatalogDeregister(t *testing.T) {
	st, c := newStub(t, nil)
	if _, err := c.Catalog().Deregister(context.Background(), &CatalogDeregistration{Node: "n1", CheckID: "disk"}, nil); err != nil {
		t.Fatal(err)
	}
	req := st.last(t)
	if req.Method != "PUT" || req.Path != "/v1/catalog/deregister" || req.Body != `{"Node":"n1","CheckID":"disk"}` {
		t.Errorf("request = %s %s %s", req.Method, req.Path, req.Body)
	}
}

func TestCatalogAndHealthReads(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name     string
		call     func(c *Client) (any, error)
		body     string
		wantPath string
		want     any
	}{
		{"nodes", func(c *Client) (any, error) { v, _, err := c.Catalog().Nodes(ctx, nil); return v, err },
			`[{"ID":"","Node":"n1","Address":"10.0.0.1","Datacenter":"dc1","TaggedAddresses":null,"Meta":null,"CreateIndex":5,"ModifyIndex":5}]`,
			"/v1/catalog/nodes", []*Node{{Node: "n1", Address: "10.0.0.1", Datacenter: "dc1", CreateIndex: 5, ModifyIndex: 5}}},
		{"node", func(c *Client) (any, error) { v, _, err := c.Catalog().Node(ctx, "n1", nil); return v, err },
			`{"Node":{"Node":"n1","Address":"10.0.0.1"},"Services":{"web":{"ID":"web","Service":"web","Port":80}}}`,
			"/v1/catalog/node/n1", &CatalogNode{Node: &Node{Node: "n1", Address: "10.0.0.1"},
				Services: map[string]*AgentService{"web": {ID: "web", Service: "web", Port: 80}}}},
		{"unknown node", func(c *Client) (any, error) { v, _, err := c.Catalog().Node(ctx, "zz", nil); return v, err },
			`null`, "/v1/catalog/node/zz", (*CatalogNode)(nil)},
		{"health of node", func(c *Client) (any, error) { v, _, err := c.Health().Node(ctx, "n1", nil); return v, err },
			`[{"Node":"n1","CheckID":"serfHealth","Name":"Serf Health Status","Status":"passing","Notes":"",` +
				`"Output":"Agent alive and reachable","ServiceID":"","ServiceName":"","ServiceTags":[],"Type":"",` +
				`"Definition":{},"CreateIndex":1,"ModifyIndex":1}]`,
			"/v1/health/node/n1", HealthChecks{{Node: "n1", CheckID: "serfHealth", Name: "Serf Health Status",
				Status: "passing", Output: "Agent alive and reachable", ServiceTags: []string{}, CreateIndex: 1, ModifyIndex: 1}}},
		{"leader", func(c *Client) (any, error) { return c.Status().Leader(ctx) }, `"10.0.0.1:8300"`, "/v1/status/leader", "10.0.0.1:8300"},
		{"peers", func(c *Client) (any, error) { return c.Status().Peers(ctx) }, `["10.0.0.1:8300","10.0.0.2:8300"]`,
			"/v1/status/peers", []string{"10.0.0.1:8300", "10.0.0.2:8300"}},
		{"node name", func(c *Client) (any, error) { return c.Agent().NodeName(ctx) },
			`{"Config":{"NodeName":"n1","Datacenter":"dc1"},"Member":{"Name":"n1"}}`, "/v1/agent/self", "n1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, c := newStub(t, func(seen) reply { return reply{Header: readHeaders("5"), Body: tt.body} })
			got, err := tt.call(c)
			if err != nil {
				t.Fatal(err)
			}
			if req := st.last(t); req.Method != "GET" || req.Path != tt.wantPath {
				t.Errorf("request = %s %s, want GET %s", req.Method, req.Path, tt.wantPath)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("result = %#v, want %#v", got, tt.want)
			}
		})
	}
}

func TestAgentNodeNameMissing(t *testing.T) {
	_, c := newStub(t, func(seen) reply { return reply{Body: `{"Config":{}}`} })
	if _, err := c.Agent().NodeName(context.Background()); err == nil {
		t.Fatal("want an error when Config.NodeName is missing")
	}
}
