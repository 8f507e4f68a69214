package state

import "time"

// DirEntry is one key of the KV store. Its JSON form is Consul's.
type DirEntry struct {
	LockIndex   uint64
	Key         string
	Flags       uint64
	Value       []byte
	Session     string `json:",omitempty"`
	CreateIndex uint64
	ModifyIndex uint64
}

// Session behaviours.
const (
	BehaviorRelease = "release"
	BehaviorDelete  = "delete"
)

// SerfCheckID is the check every node carries for gossip health; sessions
// bind to it by default.
const SerfCheckID = "serfHealth"

// Health states.
const (
	HealthPassing  = "passing"
	HealthWarning  = "warning"
	HealthCritical = "critical"
)

// MaxLockDelay is the ceiling applied to a session's LockDelay when it is
// invalidated.
const MaxLockDelay = 60 * time.Second

// ServiceCheck names a check bound to a session through a service.
type ServiceCheck struct {
	ID        string
	Namespace string
}

// Session is a session as stored. TTL is kept as the string the client gave
// ("" for none) because Consul echoes it back verbatim.
type Session struct {
	ID            string
	Name          string
	Node          string
	LockDelay     time.Duration
	Behavior      string
	TTL           string
	NodeChecks    []string
	ServiceChecks []ServiceCheck
	CreateIndex   uint64
	ModifyIndex   uint64
}

// CheckIDs lists every check the session is bound to, node checks first.
func (s *Session) CheckIDs() []string {
	out := make([]string, 0, len(s.NodeChecks)+len(s.ServiceChecks))
	out = append(out, s.NodeChecks...)
	for _, c := range s.ServiceChecks {
		out = append(out, c.ID)
	}
	return out
}

// Node is a catalog node.
type Node struct {
	ID              string
	Node            string
	Address         string
	Datacenter      string
	TaggedAddresses map[string]string
	Meta            map[string]string
	CreateIndex     uint64
	ModifyIndex     uint64
}

// Service is a service instance registered on a node.
type Service struct {
	Node        string
	ID          string
	Service     string
	Tags        []string
	Address     string
	Meta        map[string]string
	Port        int
	CreateIndex uint64
	ModifyIndex uint64
}

// HealthCheckDefinition holds how a check is run; the catalog only stores it.
type HealthCheckDefinition struct {
	HTTP     string `json:",omitempty"`
	TCP      string `json:",omitempty"`
	Method   string `json:",omitempty"`
	Interval string `json:",omitempty"`
	Timeout  string `json:",omitempty"`
	TTL      string `json:",omitempty"`
}

// HealthCheck is a check on a node, optionally tied to a service.
type HealthCheck struct {
	Node        string
	CheckID     string
	Name        string
	Status      string
	Notes       string
	Output      string
	ServiceID   string
	ServiceName string
	ServiceTags []string
	Type        string
	Definition  HealthCheckDefinition
	CreateIndex uint64
	ModifyIndex uint64
}

// ServiceQuery is the service part of a prepared query.
type ServiceQuery struct {
	Service     string
	OnlyPassing bool
	Tags        []string `json:",omitempty"`
	Near        string   `json:",omitempty"`
	// Failover is kept and returned as written. With one datacenter
	// there is nothing to fail over to, so it changes no answer.
	Failover QueryFailover `json:",omitzero"`
}

// QueryFailover is a prepared query's Service.Failover.
type QueryFailover struct {
	NearestN    int
	Datacenters []string              `json:",omitempty"`
	Targets     []QueryFailoverTarget `json:",omitempty"`
}

// QueryFailoverTarget is one of Failover.Targets: a datacenter (with
// Consul Enterprise's partition and namespace, kept as written). A Peer
// target is refused by the API.
type QueryFailoverTarget struct {
	Peer       string `json:",omitempty"`
	Datacenter string `json:",omitempty"`
	Partition  string `json:",omitempty"`
	Namespace  string `json:",omitempty"`
}

// QueryDNS is a prepared query's DNS part. holdfast serves no DNS: the
// TTL is kept and returned by execute, as Consul returns it.
type QueryDNS struct {
	TTL string
}

// PreparedQuery is a stored query. A query with a Session is deleted in the
// same step that invalidates that session.
type PreparedQuery struct {
	ID          string
	Name        string
	Session     string
	Token       string
	Service     ServiceQuery
	DNS         QueryDNS `json:",omitzero"`
	CreateIndex uint64
	ModifyIndex uint64
}
