package cli

import "testing"

func TestInfo(t *testing.T) {
	self := `{"Config":{"NodeName":"n1"},"Stats":{` +
		`"raft":{"state":"Leader","applied_index":"7"},` +
		`"holdfast":{"leader":"true","sessions":"2"},` +
		`"runtime":{"os":"linux"}}}`
	runCases(t, []cliCase{
		{name: "sections and keys sorted, as consul info", args: []string{"info"},
			reply:   answer{body: self},
			wantReq: "GET /v1/agent/self",
			wantOut: "holdfast:\n\tleader = true\n\tsessions = 2\n" +
				"raft:\n\tapplied_index = 7\n\tstate = Leader\n" +
				"runtime:\n\tos = linux\n"},
		{name: "agent down or refusing", args: []string{"info"},
			reply:   answer{code: 500, body: "boom"},
			wantReq: "GET /v1/agent/self",
			wantErr: "Error querying agent: Unexpected response code: 500 (boom)\n", wantCode: 1},
		{name: "arguments", args: []string{"info", "extra"},
			wantErr: "Error! Too many arguments (expected 0, got 1)\n", wantCode: 1},
	})
}
