// Package depstest holds the import lattice of holdfast as data and checks
// the code against it, so that an import running the wrong way fails a test
// rather than waiting for a review. It has no non-test code.
//
// Only edges between holdfast's own packages are checked, plus one rule
// about the outside world: the public client, api, imports the standard
// library and nothing else. Test files are not checked: tests may import
// fakes (clock/clocktest, internal/servertest) freely.
package depstest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// lattice maps each holdfast package, by its path inside the module, to the
// holdfast packages its non-test files may import. It is DESIGN.md's
// picture of the house, as data:
//
//	cmd -> cli -> {server, httpapi, api, api/recipe}
//	server -> {fsm, state, ttl, watch, gossip, clock, raft}
//	httpapi -> {state (types), watch, clock}
//	fsm -> state;   state -> watch;   ttl -> clock
//	api/recipe -> {api, clock};   api -> stdlib only
//
// Conventions:
//   - A key ending in "/..." covers every package below that directory that
//     has no key of its own.
//   - An allowed entry ending in "/..." admits every package below that
//     directory except the test-support packages (see testSupport), which
//     must be named one by one.
//   - Packages listed here that do not exist yet are ignored; a package
//     that exists but is not listed fails the test, so that every new
//     package states its place.
//
// Imports outside the module (the standard library, raft, go-memdb, ...)
// are not restricted here, except by stdlibOnly.
var lattice = map[string][]string{
	// Public packages.
	"api":             {},
	"api/recipe":      {"api", "clock"},
	"clock":           {},
	"clock/clocktest": {"clock"},

	// The binary: main only parses signals and calls cli.Run.
	"cmd/holdfast": {"internal/cli"},

	// The command line may use anything that is not a test fake.
	"internal/cli": {"api", "api/recipe", "clock", "internal/..."},

	// The core, bottom up.
	"internal/watch": {"clock"},
	"internal/state": {"internal/watch"}, // and hashicorp/go-memdb
	"internal/fsm":   {"internal/state"}, // and hashicorp/raft
	"internal/ttl":   {"clock"},
	// Gossip turns membership into serfHealth check updates; it may use
	// the state's types for them, as httpapi does.
	"internal/gossip":  {"clock", "internal/state"},
	"internal/httpapi": {"clock", "internal/logsample", "internal/state", "internal/watch"},
	// A leaf: one log line per interval for repeated events.
	"internal/logsample": {"clock"},
	// The HTTP/1.1 connection loop: net/http's parser and types, nothing
	// of holdfast's.
	"internal/httpserve": {},
	// The agent runs its node's checks and writes their status through a
	// CatalogWriter it declares; it uses the state's types, not the server.
	"internal/agent": {"clock", "internal/state"},
	// The server composes the core. It does not import httpapi: httpapi
	// declares the Backend it needs and cli wires the two together.
	"internal/server": {
		"clock",
		"internal/fsm",
		"internal/gossip",
		"internal/logsample",
		"internal/state",
		"internal/ttl",
		"internal/watch",
	},

	// Test support, shipped as code.
	"internal/servertest": {
		"api",
		"clock",
		"clock/clocktest",
		"internal/...",
	},
	"internal/depstest":   {}, // test files only
	"internal/transcript": {}, // golden transcripts: test files only
	"e2e":                 {}, // tests that build and run the binary: test files only

	// Benchmarks and load generators may drive anything.
	"bench/...": {
		"bench/...",
		"api",
		"api/recipe",
		"clock",
		"clock/clocktest",
		"internal/...",
		"internal/servertest",
	},
}

// stdlibOnly lists the packages whose every import, project or not, must be
// in the standard library.
var stdlibOnly = []string{"api"}

// testSupport lists packages that exist for tests. "/..." entries in the
// lattice do not admit them, so production code cannot pick them up by
// accident.
var testSupport = []string{"clock/clocktest", "internal/servertest", "internal/depstest"}

// listedPackage is the part of `go list -json` output the check reads.
type listedPackage struct {
	ImportPath string
	Imports    []string
	Standard   bool
	DepOnly    bool
	Error      *struct{ Err string }
}

func TestImportLattice(t *testing.T) {
	root, module := moduleRoot(t)
	pkgs := goList(t, root)

	for _, p := range pkgs {
		if rel, ok := relPath(module, p.ImportPath); ok && p.Error != nil {
			// Not this test's business (the build will say), but
			// worth a line when the lattice looks odd.
			t.Logf("go list: %s: %s", rel, p.Error.Err)
		}
	}
	problems := checkLattice(module, pkgs)
	for _, msg := range problems {
		t.Error(msg)
	}
	if len(problems) == 0 {
		n := 0
		for _, p := range pkgs {
			if _, ok := relPath(module, p.ImportPath); ok {
				n++
			}
		}
		t.Logf("%d holdfast packages checked", n)
	}
}

func TestLatticeIsAcyclic(t *testing.T) {
	// Only exact edges: "/..." entries are wildcards, not edges.
	const (
		unvisited = iota
		visiting
		done
	)
	state := map[string]int{}
	var path []string
	var visit func(pkg string) error
	visit = func(pkg string) error {
		switch state[pkg] {
		case visiting:
			return fmt.Errorf("cycle: %s -> %s", strings.Join(path, " -> "), pkg)
		case done:
			return nil
		}
		state[pkg] = visiting
		path = append(path, pkg)
		for _, dep := range lattice[pkg] {
			if strings.HasSuffix(dep, "/...") {
				continue
			}
			if err := visit(dep); err != nil {
				return err
			}
		}
		path = path[:len(path)-1]
		state[pkg] = done
		return nil
	}
	for _, pkg := range sortedKeys(lattice) {
		if err := visit(pkg); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCheckLatticeCatchesBadImports(t *testing.T) {
	const mod = "example.com/hf"
	pkg := func(path string, imports ...string) listedPackage {
		return listedPackage{ImportPath: path, Imports: imports}
	}
	std := func(path string) listedPackage {
		return listedPackage{ImportPath: path, Standard: true, DepOnly: true}
	}
	ext := func(path string) listedPackage {
		return listedPackage{ImportPath: path, DepOnly: true}
	}
	good := []listedPackage{
		std("time"), std("net/http"), ext("github.com/hashicorp/go-memdb"),
		pkg(mod+"/api", "net/http", "time"),
		pkg(mod+"/clock", "time"),
		pkg(mod+"/internal/watch", mod+"/clock"),
		pkg(mod+"/internal/state", mod+"/internal/watch", "github.com/hashicorp/go-memdb"),
		pkg(mod+"/internal/ttl", mod+"/clock"),
		pkg(mod+"/internal/cli", mod+"/internal/ttl", mod+"/api"),
		pkg(mod+"/bench/loadgen", mod+"/internal/servertest"),
		pkg(mod+"/internal/servertest", mod+"/clock/clocktest"),
		pkg(mod+"/clock/clocktest", mod+"/clock"),
	}
	if problems := checkLattice(mod, good); len(problems) != 0 {
		t.Fatalf("a sound tree was reported: %q", problems)
	}

	cases := []struct {
		name string
		pkgs []listedPackage
		want string
	}{
		{
			"upward edge",
			[]listedPackage{pkg(mod+"/internal/ttl", mod+"/clock", mod+"/internal/state"), pkg(mod + "/clock")},
			"internal/ttl imports internal/state",
		},
		{
			"server imports httpapi",
			[]listedPackage{pkg(mod+"/internal/server", mod+"/internal/httpapi"), pkg(mod + "/internal/httpapi")},
			"internal/server imports internal/httpapi",
		},
		{
			"api imports a module",
			[]listedPackage{pkg(mod+"/api", "github.com/hashicorp/go-cleanhttp"), ext("github.com/hashicorp/go-cleanhttp")},
			"api must import only the standard library, but imports github.com/hashicorp/go-cleanhttp",
		},
		{
			"api imports the project",
			[]listedPackage{pkg(mod+"/api", mod+"/clock"), pkg(mod + "/clock")},
			"api must import only the standard library, but imports " + mod + "/clock",
		},
		{
			"package missing from the lattice",
			[]listedPackage{pkg(mod + "/internal/newthing")},
			"internal/newthing is not in the import lattice",
		},
		{
			"test fake in production code",
			[]listedPackage{pkg(mod+"/internal/cli", mod+"/clock/clocktest"), pkg(mod+"/clock/clocktest", mod+"/clock")},
			"internal/cli imports clock/clocktest",
		},
		{
			"wildcard does not admit test fakes",
			[]listedPackage{pkg(mod+"/internal/cli", mod+"/internal/servertest"), pkg(mod + "/internal/servertest")},
			"internal/cli imports internal/servertest",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			problems := checkLattice(mod, c.pkgs)
			if len(problems) != 1 || !strings.Contains(problems[0], c.want) {
				t.Fatalf("got %q, want one problem containing %q", problems, c.want)
			}
		})
	}
}

// checkLattice returns one message per violation of the lattice among pkgs,
// the output of go list -deps for module.
func checkLattice(module string, pkgs []listedPackage) []string {
	byPath := make(map[string]listedPackage, len(pkgs))
	for _, p := range pkgs {
		byPath[p.ImportPath] = p
	}
	var problems []string
	for _, p := range pkgs {
		rel, ok := relPath(module, p.ImportPath)
		if !ok {
			continue
		}
		if slices.Contains(stdlibOnly, rel) {
			for _, imp := range p.Imports {
				if !byPath[imp].Standard {
					problems = append(problems, fmt.Sprintf(
						"%s must import only the standard library, but imports %s", rel, imp))
				}
			}
		}
		allowed, ok := rule(rel)
		if !ok {
			problems = append(problems, fmt.Sprintf(
				"%s is not in the import lattice: add it to lattice in internal/depstest/deps_test.go, "+
					"with the holdfast packages it may import (and update DESIGN.md)", rel))
			continue
		}
		for _, imp := range p.Imports {
			to, ok := relPath(module, imp)
			if !ok || admits(allowed, to) {
				continue
			}
			if slices.Contains(stdlibOnly, rel) {
				continue // already reported above
			}
			problems = append(problems, fmt.Sprintf(
				"%s imports %s, which the import lattice does not allow (%s may import %s); "+
					"if the design has changed, change lattice in internal/depstest/deps_test.go and say why",
				rel, to, rel, describe(allowed)))
		}
	}
	return problems
}

// rule finds the lattice entry for a package: its own key, or else the
// longest "/..." key above it.
func rule(rel string) ([]string, bool) {
	if allowed, ok := lattice[rel]; ok {
		return allowed, true
	}
	best, found := "", false
	for key := range lattice {
		dir, ok := strings.CutSuffix(key, "/...")
		if ok && strings.HasPrefix(rel, dir+"/") && len(dir) > len(best) {
			best, found = dir, true
		}
	}
	if !found {
		return nil, false
	}
	return lattice[best+"/..."], true
}

// admits reports whether an allowed list lets a package import to.
func admits(allowed []string, to string) bool {
	for _, a := range allowed {
		if a == to {
			return true
		}
		if dir, ok := strings.CutSuffix(a, "/..."); ok &&
			strings.HasPrefix(to, dir+"/") && !slices.Contains(testSupport, to) {
			return true
		}
	}
	return false
}

func describe(allowed []string) string {
	if len(allowed) == 0 {
		return "no holdfast package"
	}
	return "only " + strings.Join(allowed, ", ")
}

// relPath returns path inside module, and false if path is not module's.
func relPath(module, path string) (string, bool) {
	if path == module {
		return ".", true
	}
	rel, ok := strings.CutPrefix(path, module+"/")
	return rel, ok
}

// moduleRoot walks up from the test's working directory (the package
// directory under go test) to the directory holding go.mod, and returns it
// with the module path declared there.
func moduleRoot(t *testing.T) (dir, module string) {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil {
			for line := range strings.Lines(string(data)) {
				if m, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
					return dir, strings.Trim(strings.TrimSpace(m), `"`)
				}
			}
			t.Fatalf("%s/go.mod has no module line", dir)
		}
		if !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's working directory")
		}
		dir = parent
	}
}

// goList runs go list -deps on every package of the module at root.
func goList(t *testing.T, root string) []listedPackage {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("the go command is needed to list imports: %v", err)
	}
	// -e: a package that does not build is still listed with its imports;
	// compiling it is other tests' job.
	cmd := exec.Command(goBin, "list", "-e", "-deps",
		"-json=ImportPath,Imports,Standard,DepOnly,Error", "./...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	var pkgs []listedPackage
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listedPackage
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("decoding go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) == 0 {
		t.Fatal("go list found no packages")
	}
	return pkgs
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
