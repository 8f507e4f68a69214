package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
// registry and after each TTL update: the status of a TTL check and when
// its TTL runs out are part of what is kept. A TTL check comes back with
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
	a.pending = &st
	return nil
}

// save writes the registry to the state file, the restored part that is
// not registered yet included. A failure is logged: the registry change it
// follows has happened, in the catalog too.
func (a *Agent) save() {
	if a.cfg.StateFile == "" || a.restoring.Load() {
		return // Restore saves once, when it is done
	}
	a.saveMu.Lock()
	defer a.saveMu.Unlock()
	b, err := json.MarshalIndent(a.snapshot(), "", "  ")
	if err == nil {
		err = writeFileAtomic(a.cfg.StateFile, b)
	}
	if err != nil {
		a.log.Error("could not save the agent's registrations; a restart would lose the latest", "file", a.cfg.StateFile, "error", err)
	}
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
		st.Checks = append(st.Checks, &savedCheck{Definition: r.def, Status: cur.Status, Expires: exp})
	}
	if p := a.pending; p != nil {
		for _, s := range p.Services {
			if a.services[s.ID] == nil {
				st.Services = append(st.Services, s)
			}
		}
		for _, c := range p.Checks {
			if a.checks[c.Definition.ID] == nil {
				st.Checks = append(st.Checks, c)
			}
		}
	}
	sort.Slice(st.Services, func(i, j int) bool { return st.Services[i].ID < st.Services[j].ID })
	sort.Slice(st.Checks, func(i, j int) bool { return st.Checks[i].Definition.ID < st.Checks[j].Definition.ID })
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
// A service or check registered since (through the API) is left as it is.
// What fails to register stays pending, kept in the file, and not
// forgotten by ForgetStale; Restore may be called again. A server calls it
// once it leads, before ForgetStale.
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
	// A TTL start a failed registration left unused must not shorten the
	// TTL of a later registration of the same ID through the API.
	defer func() {
		a.mu.Lock()
		clear(a.ttlStart)
		a.mu.Unlock()
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
	var firstErr error
	note := func(what string, err error) {
		if err != nil && firstErr == nil {
			firstErr = fmt.Errorf("agent: restoring %s: %w", what, err)
		}
	}
	for _, s := range p.Services {
		if a.hasService(s.ID) {
			continue
		}
		defs := make([]*state.CheckDefinition, 0, len(byService[s.ID]))
		for _, c := range byService[s.ID] {
			defs = append(defs, a.restoredDefinition(c, now))
		}
		note("service "+s.ID, a.RegisterService(ctx, s, defs, false))
	}
	for _, c := range alone {
		if a.hasCheck(c.Definition.ID) {
			continue
		}
		note("check "+c.Definition.ID, a.RegisterCheck(ctx, a.restoredDefinition(c, now)))
	}
	if firstErr == nil {
		a.mu.Lock()
		a.pending = nil
		a.mu.Unlock()
	}
	return firstErr
}

// restoredDefinition is the definition to register a saved check with:
// its last status, and for a TTL check the rest of its TTL (see prepare).
func (a *Agent) restoredDefinition(c *savedCheck, now time.Time) *state.CheckDefinition {
	d := c.Definition
	d.Status = c.Status
	if d.TTL > 0 {
		if c.Expires.IsZero() || !now.Before(c.Expires) {
			d.Status = state.HealthCritical
		} else {
			a.mu.Lock()
			a.ttlStart[d.ID] = c.Expires.Add(-d.TTL)
			a.mu.Unlock()
		}
	}
	return &d
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
		ids = append(ids, c.Definition.ID)
	}
	return ids
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
		if c.Definition.ID != id {
			kept = append(kept, c)
		}
	}
	a.pending.Checks = kept
}
