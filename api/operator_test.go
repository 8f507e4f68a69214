package api

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

// An unhealthy cluster (429) is an answer; a server never asked has no
// LastContact (null), which reads as negative.
func TestAutopilotServerHealthUnhealthyIsAnAnswer(t *testing.T) {
	_, c := newStub(t, func(s seen) reply {
		return reply{Code: http.StatusTooManyRequests, Body: `{"Healthy":false,"FailureTolerance":0,"Servers":[` +
			`{"ID":"n1","Name":"n1","Address":"127.0.0.1:8300","SerfStatus":"alive","Leader":true,"LastContact":"0s","LastTerm":2,"LastIndex":9,"Healthy":true,"Voter":true,"StableSince":"2026-11-28T19:40:02Z"},` +
			`{"ID":"n2","Name":"n2","Address":"127.0.0.1:8310","SerfStatus":"failed","Leader":false,"LastContact":null,"LastTerm":0,"LastIndex":0,"Healthy":false,"Voter":true,"StableSince":"2026-11-28T19:41:17Z"}]}`}
	})
	h, err := c.Operator().AutopilotServerHealth(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if h.Healthy || len(h.Servers) != 2 || h.Servers[0].LastContact != 0 || h.Servers[1].LastContact >= 0 ||
		h.Servers[1].SerfStatus != "failed" || !h.Servers[1].StableSince.Equal(time.Date(2026, 11, 28, 19, 41, 17, 0, time.UTC)) {
		t.Fatalf("%+v", h)
	}
}

// Any other failure stays an error, with the server's sentence.
func TestAutopilotServerHealthError(t *testing.T) {
	_, c := newStub(t, func(s seen) reply { return reply{Code: 500, Body: "No cluster leader"} })
	if _, err := c.Operator().AutopilotServerHealth(context.Background(), nil); err == nil || !strings.Contains(err.Error(), "No cluster leader") {
		t.Fatalf("got %v", err)
	}
}

func TestAutopilotGetConfiguration(t *testing.T) {
	st, c := newStub(t, func(s seen) reply {
		return reply{Body: `{"CleanupDeadServers":true,"LastContactThreshold":"200ms","MaxTrailingLogs":250,"MinQuorum":0,` +
			`"ServerStabilizationTime":"0s","RedundancyZoneTag":"","DisableUpgradeMigration":false,"UpgradeVersionTag":"","CreateIndex":0,"ModifyIndex":0}`}
	})
	conf, err := c.Operator().AutopilotGetConfiguration(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !conf.CleanupDeadServers || conf.LastContactThreshold != 200*time.Millisecond || conf.MaxTrailingLogs != 250 || conf.ServerStabilizationTime != 0 {
		t.Fatalf("%+v", conf)
	}
	if s := st.last(t); s.Method != "GET" || s.Path != "/v1/operator/autopilot/configuration" {
		t.Fatalf("request: %s %s", s.Method, s.Path)
	}
}
