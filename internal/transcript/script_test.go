package transcript

import (
	"fmt"
	"strconv"
	"strings"
)

// block is one step of a transcript: the comment lines before it, its
// command lines and the output recorded under them.
type block struct {
	pre  []string // comments and blank lines before the commands, verbatim
	cmds []string // command lines, continuation lines included
	out  []string // expected output lines
	line int      // line number of the first command line
}

// script is a parsed transcript file.
type script struct {
	name   string
	blocks []*block
	tail   []string // comments and blank lines after the last block
}

const separator = "----"

// parseScript splits a transcript into blocks. It fails on a command
// section with no "----" after it, on a "----" with no command above it, and
// on a block whose output is empty.
func parseScript(name, text string) (*script, error) {
	s := &script{name: name}
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	if text == "" {
		lines = nil
	}
	var pending []string
	for i := 0; i < len(lines); {
		l := lines[i]
		if strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#") {
			pending = append(pending, l)
			i++
			continue
		}
		b := &block{pre: pending, line: i + 1}
		pending = nil
		for ; i < len(lines) && lines[i] != separator; i++ {
			if strings.TrimSpace(lines[i]) == "" {
				return nil, fmt.Errorf("%s:%d: blank line in a command section (missing %q?)", name, i+1, separator)
			}
			b.cmds = append(b.cmds, lines[i])
		}
		if i == len(lines) {
			return nil, fmt.Errorf("%s:%d: command without %q and output", name, b.line, separator)
		}
		if len(b.cmds) == 0 {
			return nil, fmt.Errorf("%s:%d: %q without a command above it", name, i+1, separator)
		}
		i++ // the separator
		for ; i < len(lines) && strings.TrimSpace(lines[i]) != ""; i++ {
			b.out = append(b.out, lines[i])
		}
		if len(b.out) == 0 {
			return nil, fmt.Errorf("%s:%d: empty output (run with -update to fill it in)", name, b.line)
		}
		s.blocks = append(s.blocks, b)
	}
	s.tail = pending
	return s, nil
}

// render writes the script back, with outs in place of the recorded
// outputs (outs[i] belongs to blocks[i]).
func (s *script) render(outs [][]string) string {
	var b strings.Builder
	for i, bl := range s.blocks {
		for _, l := range bl.pre {
			b.WriteString(l + "\n")
		}
		if i > 0 && len(bl.pre) == 0 {
			// Output runs to the next blank line, so blocks need one
			// between them.
			b.WriteString("\n")
		}
		for _, l := range bl.cmds {
			b.WriteString(l + "\n")
		}
		b.WriteString(separator + "\n")
		for _, l := range outs[i] {
			b.WriteString(l + "\n")
		}
	}
	for _, l := range s.tail {
		b.WriteString(l + "\n")
	}
	return b.String()
}

// command is one parsed command line, with its continuation lines as
// sub-commands.
type command struct {
	name string            // "kv acquire", "advance", ...
	pos  []string          // positional arguments, $names resolved later
	opts map[string]string // NAME=VALUE options
	bind string            // "$x" after "->", or ""
	sub  []*command        // continuation lines (txn operations)
	line int
}

// groups are the commands whose name is two words.
var groups = map[string]bool{"session": true, "kv": true, "catalog": true, "wait": true}

// parseCommands parses the command lines of a block.
func parseCommands(b *block) ([]*command, error) {
	var out []*command
	for i, l := range b.cmds {
		line := b.line + i
		indented := l[0] == ' ' || l[0] == '\t'
		words, err := tokenize(l)
		if err != nil {
			return nil, fmt.Errorf("line %d: %v", line, err)
		}
		c, err := newCommand(words, line, !indented)
		if err != nil {
			return nil, fmt.Errorf("line %d: %v", line, err)
		}
		if indented {
			if len(out) == 0 {
				return nil, fmt.Errorf("line %d: indented line with no command above it", line)
			}
			parent := out[len(out)-1]
			parent.sub = append(parent.sub, c)
			continue
		}
		out = append(out, c)
	}
	return out, nil
}

// word is a token of a command line; quoted words are always positional.
type word struct {
	text   string
	quoted bool
}

// tokenize splits a line into words at spaces; a word in double quotes is
// unquoted as a Go string literal.
func tokenize(l string) ([]word, error) {
	var out []word
	l = strings.TrimSpace(l)
	for l != "" {
		if l[0] == '"' {
			end := 1
			for ; end < len(l); end++ {
				if l[end] == '\\' {
					end++
					continue
				}
				if l[end] == '"' {
					break
				}
			}
			if end >= len(l) {
				return nil, fmt.Errorf("unterminated quoted word in %q", l)
			}
			s, err := strconv.Unquote(l[:end+1])
			if err != nil {
				return nil, fmt.Errorf("bad quoted word %s: %v", l[:end+1], err)
			}
			out = append(out, word{s, true})
			l = strings.TrimSpace(l[end+1:])
			continue
		}
		n := strings.IndexAny(l, " \t")
		if n < 0 {
			n = len(l)
		}
		out = append(out, word{l[:n], false})
		l = strings.TrimSpace(l[n:])
	}
	return out, nil
}

// newCommand builds a command from its words. With top set, a first word
// that names a group takes the second word into the command's name.
func newCommand(words []word, line int, top bool) (*command, error) {
	if len(words) == 0 {
		return nil, fmt.Errorf("empty command")
	}
	c := &command{opts: map[string]string{}, line: line}
	c.name = words[0].text
	words = words[1:]
	if top && groups[c.name] {
		if len(words) == 0 || words[0].quoted {
			return nil, fmt.Errorf("%q needs a subcommand", c.name)
		}
		c.name += " " + words[0].text
		words = words[1:]
	}
	for i := 0; i < len(words); i++ {
		w := words[i]
		switch {
		case !w.quoted && w.text == "->":
			if i != len(words)-2 || !strings.HasPrefix(words[i+1].text, "$") || len(words[i+1].text) < 2 {
				return nil, fmt.Errorf(`"->" must be followed by one $name at the end of the line`)
			}
			c.bind = words[i+1].text
			i++
		case !w.quoted && isOption(w.text):
			k, v, _ := strings.Cut(w.text, "=")
			if _, dup := c.opts[k]; dup {
				return nil, fmt.Errorf("option %s given twice", k)
			}
			c.opts[k] = v
		default:
			c.pos = append(c.pos, w.text)
		}
	}
	return c, nil
}

// isOption reports whether w looks like NAME=VALUE with a lower-case,
// dashed NAME.
func isOption(w string) bool {
	k, _, ok := strings.Cut(w, "=")
	if !ok || k == "" {
		return false
	}
	for _, r := range k {
		if !(r >= 'a' && r <= 'z' || r == '-') {
			return false
		}
	}
	return true
}
