package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"time"

	"github.com/holdfast/holdfast/internal/state"
)

// The agent keeps its registrations in Config.StateFile, so that a restart
// brings back its services and checks, as Consul's agent does. Without
// this the agent's checks would go at every restart (ForgetStale removes
// what nobody runs), and every session bound to one with them.
//
// The file is rewritten whole, atomically, after each change of the
// registry, after each TTL update and after each status change of an HTTP
// or TCP check: every check's status, and when a TTL check's TTL runs
// out, are part of what is kept. A TTL check comes back with
// the status it had and the rest of its TTL; one whose TTL ran out while
// the agent was down comes back critical. Other checks come back with
// their last status until their first probe, which runs at once.

// stateVersion is the format of the state file.
const stateVersion = 1

type savedState struct {
	Version  int              `json:"version"`
	Services []*state.Service `json:"services"`
	Checks   []*savedCheck    `json:"checks"`
}

type savedCheck struct {
	Definition state.CheckDefinition `json:"definition"`
	Status     string                `json:"status"`
	Output     string                `json:"output,omitempty"`
	// Expires is when a TTL check's TTL runs out (zero once it has).
	Expires time.Time `json:"expires,omitempty"`
}

// load reads the state file into a.pending. A file that cannot be read
// as a state file is moved aside (the error says where) and the agent
// starts empty.
func (a *Agent) load() error {
	b, err := os.ReadFile(a.cfg.StateFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("agent: reading %s: %w", a.cfg.StateFile, err)
	}
	var st savedState
	if err := json.Unmarshal(b, &st); err != nil || st.Version != stateVersion {
		if err == nil {
			err = fmt.Errorf("version %d, want %d", st.Version, stateVersion)
		}
		aside := a.cfg.StateFile + ".unreadable"
		if rerr := os.Rename(a.cfg.StateFile, aside); rerr != nil {
			return fmt.Errorf("agent: %s is not a state file (%v) and could not be moved aside: %w", a.cfg.StateFile, err, rerr)
		}
		return fmt.Errorf("agent: %s is not a state file (%v); moved to %s, starting with no registrations", a.cfg.StateFile, err, aside)
	}
	// A null entry (a hand-edited file) holds nothing to restore.
	st.Services = slices.DeleteFunc(st.Services, func(s *state.Service) bool { return s == nil })
	st.Checks = slices.DeleteFunc(st.Checks, func(c *savedCheck) bool { return c == nil })
	a.pending = &st
	return nil
}

// savedServiceID is the ID a saved service is registered under: its ID,
// or its name if it has none (see RegisterService).
func savedServiceID(s *state.Service) string {
	if s.ID != "" {
		return s.ID
	}
	return s.Service
}

// savedCheckID is the ID a saved check of no service is registered under:
// its ID, or its name if it has none (see validate).
func savedCheckID(d *state.CheckDefinition) string {
	if d.ID != "" {
		return d.ID
	}
	return d.Name
}

// save writes the registry to the state file, the restored part that is
// not registered yet included. A failure is logged: the registry change it
// follows has happened, in the catalog too.
func (a *Agent) save() { a.persist() }

// persist is save, and also returns the failure, for the registrations and
// deregistrations asked for through the API: as Consul's agent does, they
// are answered with an error (a 500) when the change could not be kept,
// although it is in the catalog, rather than with a success that the next
// restart would undo.
func (a *Agent) persist() error {
	if a.cfg.StateFile == "" || a.restoring.Load() {
		return nil // Restore saves once, when it is done
	}
	a.saveMu.Lock()
	defer a.saveMu.Unlock()
	b, err := json.MarshalIndent(a.snapshot(), "", "  ")
	if err == nil {
		err = writeFileAtomic(a.cfg.StateFile, b)
	}
	if err != nil {
		a.log.Error("could not save the agent's registrations; a restart would lose the latest", "file", a.cfg.StateFile, "error", err)
		return fmt.Errorf("the change is in the catalog, but the agent could not save it to %s (%v): "+
			"a restart of the agent would undo it; fix what the error names (a full disk, the directory's permissions, "+
			"too many open files) and make the same request again", a.cfg.StateFile, err)
	}
	return nil
}

func (a *Agent) snapshot() *savedState {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := &savedState{Version: stateVersion, Services: []*state.Service{}, Checks: []*savedCheck{}}
	for _, s := range a.services {
		st.Services = append(st.Services, s)
	}
	for _, r := range a.checks {
		cur, exp := r.saved()
		st.Checks = append(st.Checks, &savedCheck{Definition: r.def, Status: cur.Status, Output: cur.Output, Expires: exp})
	}
	sort.Slice(st.Services, func(i, j int) bool { return st.Services[i].ID < st.Services[j].ID })
	sort.Slice(st.Checks, func(i, j int) bool { return st.Checks[i].Definition.ID < st.Checks[j].Definition.ID })
	// What is still pending goes after the registry, in the order it was
	// read: the order of a service's checks names those without an ID, and
	// of entries that share an ID decides which one is registered. Once a
	// service is registered (restored, or through the API since), its
	// saved copy and the saved checks it had are superseded; so is a saved
	// check of no service once its ID is registered.
	if p := a.pending; p != nil {
		for _, s := range p.Services {
			if a.services[savedServiceID(s)] == nil {
				st.Services = append(st.Services, s)
			}
		}
		for _, c := range p.Checks {
			if sid := c.Definition.ServiceID; sid != "" {
				if a.services[sid] == nil {
					st.Checks = append(st.Checks, c)
				}
			} else if a.checks[savedCheckID(&c.Definition)] == nil {
				st.Checks = append(st.Checks, c)
			}
		}
	}
	return st
}

// writeFileAtomic replaces path with b: a temporary file, synced, renamed
// over it, and the directory synced.
func writeFileAtomic(path string, b []byte) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Restore registers again what the state file held when the agent was
// made: its services with their checks, then the checks of no service.
// A service or check registered since (through the API) is left as it is,
// and its saved copy dropped. What fails to register stays pending, kept
// in the file, and not forgotten by ForgetStale; Restore may be called
// again, and tries only that. A server calls it once it leads, before
// ForgetStale.
func (a *Agent) Restore(ctx context.Context) error {
	a.mu.Lock()
	p := a.pending
	a.mu.Unlock()
	if p == nil {
		return nil
	}
	// One write of the file for the whole restore, not one per
	// registration (each is synced); it also covers registrations made
	// through the API meanwhile.
	a.restoring.Store(true)
	defer func() {
		a.restoring.Store(false)
		a.save()
	}()
	now := a.cfg.Clock.Now()
	byService := map[string][]*savedCheck{}
	var alone []*savedCheck
	for _, c := range p.Checks {
		if c.Definition.ServiceID != "" {
			byService[c.Definition.ServiceID] = append(byService[c.Definition.ServiceID], c)
		} else {
			alone = append(alone, c)
		}
	}
	// left is what failed: only that stays pending. An entry restored is
	// not kept beside the registration it became, which may carry another
	// ID (a saved check or service without one is named when registered).
	left := &savedState{Version: stateVersion}
	var firstErr error
	note := func(what string, err error) {
		if err != nil && firstErr == nil {
			firstErr = fmt.Errorf("agent: restoring %s: %w", what, err)
		}
	}
	known := map[string]bool{}
	for _, s := range p.Services {
		id := savedServiceID(s)
		known[id] = true
		if a.hasService(id) {
			continue // registered since, or by an earlier entry of the file
		}
		cs := byService[id]
		defs := make([]*state.CheckDefinition, len(cs))
		rss := make([]restoredCheck, len(cs))
		for i, c := range cs {
			defs[i], rss[i] = restoredDefinition(c, now)
		}
		if err := a.registerService(ctx, s, defs, false, rss); err != nil {
			if refused(err) {
				a.log.Error("dropping a saved service this agent now refuses; ForgetStale takes it and its checks out of the catalog",
					"service", id, "error", err)
				continue
			}
			note("service "+id, err)
			left.Services = append(left.Services, s)
			left.Checks = append(left.Checks, cs...)
		}
	}
	for id, cs := range byService {
		if !known[id] {
			// Nothing can bring these back: their service is not in the
			// file. The agent never writes such a file.
			a.log.Warn("dropping saved checks of a service the state file does not have", "service", id, "checks", len(cs))
		}
	}
	for _, c := range alone {
		id := savedCheckID(&c.Definition)
		if a.hasCheck(id) {
			continue
		}
		def, rs := restoredDefinition(c, now)
		if err := a.registerCheck(ctx, def, rs); err != nil {
			if refused(err) {
				a.log.Error("dropping a saved check this agent now refuses; ForgetStale takes it out of the catalog",
					"check", id, "error", err)
				continue
			}
			note("check "+id, err)
			left.Checks = append(left.Checks, c)
		}
	}
	a.mu.Lock()
	if firstErr == nil {
		a.pending = nil
	} else if cur := a.pending; cur != nil {
		// What failed, less what was deregistered meanwhile (which
		// replaced a.pending with a copy that lacks it).
		failedSvc := make(map[*state.Service]bool, len(left.Services))
		for _, s := range left.Services {
			failedSvc[s] = true
		}
		failedChk := make(map[*savedCheck]bool, len(left.Checks))
		for _, c := range left.Checks {
			failedChk[c] = true
		}
		next := &savedState{Version: cur.Version}
		for _, s := range cur.Services {
			if failedSvc[s] {
				next.Services = append(next.Services, s)
			}
		}
		for _, c := range cur.Checks {
			if failedChk[c] {
				next.Checks = append(next.Checks, c)
			}
		}
		a.pending = next
	}
	a.mu.Unlock()
	return firstErr
}

// refused reports whether a registration failed because the agent (or
// the catalog) refuses the definition itself, which no retry mends: such
// a saved entry is dropped rather than kept pending, where ForgetStale
// would leave its catalog check, passing, for ever.
func refused(err error) bool { return errors.Is(err, state.ErrInvalidRequest) }

// restoredDefinition is the definition to register a saved check with,
// with its last status, and its last output. For a TTL check with time
// left it also gives when that TTL started, so that the check gets only
// the rest of it; the zero time otherwise (the TTL starts at registration).
func restoredDefinition(c *savedCheck, now time.Time) (*state.CheckDefinition, restoredCheck) {
	d := c.Definition
	d.Status = c.Status
	output := c.Output
	var start time.Time
	if d.TTL > 0 {
		if c.Expires.IsZero() || !now.Before(c.Expires) {
			d.Status = state.HealthCritical
			if !c.Expires.IsZero() {
				// It ran out while the agent was down: say so, as the
				// runner would have. (Zero: it had run out before the
				// file was written, and its output says so already.)
				output = ttlExpiredOutput(output)
			}
		} else {
			// Never more than one TTL from now, whatever the file says:
			// a clock stepped back between runs would otherwise stretch
			// the saved deadline (and keep the check passing) by as much.
			expires := c.Expires
			if limit := now.Add(d.TTL); expires.After(limit) {
				expires = limit
			}
			start = expires.Add(-d.TTL)
		}
	}
	return &d, restoredCheck{start: start, output: output}
}

func (a *Agent) hasService(id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.services[id] != nil
}

func (a *Agent) hasCheck(id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.checks[id] != nil
}

// pendingChecks returns the IDs of the saved checks not restored yet.
func (a *Agent) pendingChecks() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pending == nil {
		return nil
	}
	ids := make([]string, 0, len(a.pending.Checks))
	for _, c := range a.pending.Checks {
		if c.Definition.ServiceID == "" {
			ids = append(ids, savedCheckID(&c.Definition))
		} else {
			ids = append(ids, c.Definition.ID)
		}
	}
	return ids
}

// pendingServiceLocked reports whether a saved service of this ID waits
// for Restore. a.mu must be held.
func (a *Agent) pendingServiceLocked(id string) bool {
	if a.pending == nil {
		return false
	}
	for _, s := range a.pending.Services {
		if savedServiceID(s) == id {
			return true
		}
	}
	return false
}

// forgetPendingServiceLocked drops a saved service, and the saved checks
// it had, once the service is deregistered. a.mu must be held.
func (a *Agent) forgetPendingServiceLocked(id string) {
	if a.pending == nil {
		return
	}
	p := &savedState{Version: a.pending.Version}
	for _, s := range a.pending.Services {
		if savedServiceID(s) != id {
			p.Services = append(p.Services, s)
		}
	}
	for _, c := range a.pending.Checks {
		if c.Definition.ServiceID != id {
			p.Checks = append(p.Checks, c)
		}
	}
	a.pending = p
}

// forgetPending drops a saved check that was deregistered before Restore
// brought it back.
func (a *Agent) forgetPending(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pending == nil {
		return
	}
	kept := a.pending.Checks[:0:0]
	for _, c := range a.pending.Checks {
		if c.Definition.ID != id && (c.Definition.ServiceID != "" || savedCheckID(&c.Definition) != id) {
			kept = append(kept, c)
		}
	}
	a.pending = &savedState{Version: a.pending.Version, Services: a.pending.Services, Checks: kept}
}
