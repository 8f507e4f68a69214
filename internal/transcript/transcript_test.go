package transcript

import (
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/holdfast/holdfast/internal/servertest"
)

var update = flag.Bool("update", false, "rewrite testdata/*.txt with the output actually seen")

// TestTranscripts runs every testdata/*.txt against a fresh server of its
// own and compares each block's output with the one recorded.
func TestTranscripts(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no transcripts in testdata")
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) {
			t.Parallel()
			runFile(t, f)
		})
	}
}

func runFile(t *testing.T, path string) {
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := parseScript(path, string(text))
	if err != nil && *update {
		// A new transcript may have blocks with no output yet.
		s, err = parseScript(path, fillEmpty(string(text)))
	}
	if err != nil {
		t.Fatal(err)
	}
	r := newRunner(servertest.New(t, servertest.Options{}))
	outs := make([][]string, len(s.blocks))
	for i, b := range s.blocks {
		cmds, err := parseCommands(b)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		for _, c := range cmds {
			lines, err := r.run(c)
			if err != nil {
				t.Fatalf("%s:%d: %v", path, c.line, err)
			}
			outs[i] = append(outs[i], lines...)
		}
	}
	if *update {
		if err := os.WriteFile(path, []byte(s.render(outs)), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	for i, b := range s.blocks {
		if !reflect.DeepEqual(b.out, outs[i]) {
			t.Errorf("%s:%d:\n%s\n----\nwant:\n%s\ngot:\n%s", path, b.line,
				strings.Join(b.cmds, "\n"), strings.Join(b.out, "\n"), strings.Join(outs[i], "\n"))
		}
	}
}

// fillEmpty gives every "----" followed directly by a blank line or the end
// a placeholder output line, so that a freshly written script parses and
// -update can fill it in.
func fillEmpty(text string) string {
	lines := strings.Split(text, "\n")
	var out []string
	for i, l := range lines {
		out = append(out, l)
		if l == separator && (i+1 == len(lines) || strings.TrimSpace(lines[i+1]) == "") {
			out = append(out, "?")
		}
	}
	return strings.Join(out, "\n")
}

func TestParseScript(t *testing.T) {
	const text = `# header

kv put a 1
kv get a
----
true
a: value="1"

# second
txn
  set "x y" "with space"
  lock k $s value=v
----
ok
`
	s, err := parseScript("t", text)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.blocks) != 2 {
		t.Fatalf("%d blocks", len(s.blocks))
	}
	b := s.blocks[0]
	if !reflect.DeepEqual(b.pre, []string{"# header", ""}) || b.line != 3 ||
		!reflect.DeepEqual(b.out, []string{"true", `a: value="1"`}) {
		t.Fatalf("block 0: %+v", b)
	}
	cmds, err := parseCommands(s.blocks[1])
	if err != nil {
		t.Fatal(err)
	}
	if len(cmds) != 1 || cmds[0].name != "txn" || len(cmds[0].sub) != 2 {
		t.Fatalf("txn: %+v", cmds)
	}
	set, lock := cmds[0].sub[0], cmds[0].sub[1]
	if set.name != "set" || !reflect.DeepEqual(set.pos, []string{"x y", "with space"}) {
		t.Fatalf("set: %+v", set)
	}
	if lock.name != "lock" || !reflect.DeepEqual(lock.pos, []string{"k", "$s"}) || lock.opts["value"] != "v" {
		t.Fatalf("lock: %+v", lock)
	}
	if got := s.render([][]string{b.out, s.blocks[1].out}); got != text {
		t.Fatalf("render does not round-trip:\n%s", got)
	}

	cmds, err = parseCommands(&block{cmds: []string{`session create name=a "k=v" -> $a`}, line: 1})
	if err != nil || cmds[0].name != "session create" || cmds[0].bind != "$a" ||
		cmds[0].opts["name"] != "a" || !reflect.DeepEqual(cmds[0].pos, []string{"k=v"}) {
		t.Fatalf("session create: %+v %v", cmds, err)
	}
}

func TestParseScriptErrors(t *testing.T) {
	for _, text := range []string{
		"kv get a\n",                // no separator
		"kv get a\n----\n",          // no output
		"----\nx\n",                 // separator first
		"kv get a\n\n----\nx\n",     // blank inside commands
		"kv get a\n----\n\nother\n", // output missing
	} {
		if _, err := parseScript("t", text); err == nil {
			t.Errorf("%q parsed", text)
		}
	}
	for _, l := range []string{"kv", `kv get "a`, "session create -> a", "session create -> $a extra", "kv put a=1 a=2"} {
		if _, err := parseCommands(&block{cmds: []string{l}, line: 1}); err == nil {
			t.Errorf("%q parsed", l)
		}
	}
	if _, err := parseCommands(&block{cmds: []string{"  set a"}, line: 1}); err == nil {
		t.Error("indented first line parsed")
	}
}
