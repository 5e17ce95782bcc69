package taskgen

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"unicode/utf8"

	yaml "go.yaml.in/yaml/v3"
)

// source is a Task's YAML text and its node tree. The generator edits the text at the places
// the nodes point to, never re-encodes the tree: re-encoding would reorder nothing but would
// still drop blank lines, re-flow long strings and move comments, and a reviewer diffing the
// remote Task against its original wants to see only what changed.
type source struct {
	text       string
	lineStarts []int // byte offset of each line; lineStarts[0] is line 1
	root       *yaml.Node
	edits      []edit
	// noFinalNewline: the input's last line has no newline (text has one added).
	noFinalNewline bool
}

// edit replaces text[at:end] with text; at == end inserts.
type edit struct {
	at, end int
	text    string
}

func parseSource(text string) (*source, error) {
	if strings.Contains(text, "\r") {
		return nil, fmt.Errorf("the Task has CR (\\r) line endings; convert it to LF line endings first")
	}
	dec := yaml.NewDecoder(strings.NewReader(text))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("the Task is not YAML: %w", err)
	}
	var more yaml.Node
	if err := dec.Decode(&more); err != io.EOF {
		return nil, fmt.Errorf("the input holds more than one YAML document; give taskgen one Task")
	}
	if len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, fmt.Errorf("the input is not a YAML mapping, so not a Task")
	}
	// Edits work on whole lines: a last line without its newline gets one while they are
	// made, and loses it again if nothing is added after it.
	s := &source{text: text, root: doc.Content[0], noFinalNewline: text != "" && !strings.HasSuffix(text, "\n")}
	if s.noFinalNewline {
		s.text += "\n"
	}
	s.lineStarts = append(s.lineStarts, 0)
	for i := 0; i < len(s.text); i++ {
		if s.text[i] == '\n' && i+1 < len(s.text) {
			s.lineStarts = append(s.lineStarts, i+1)
		}
	}
	return s, nil
}

// offset is the byte offset of a node's line and column (both 1-based, columns in
// characters, as yaml.v3 counts them).
func (s *source) offset(line, column int) int {
	start := s.lineStarts[line-1]
	i := start
	for c := 1; c < column && i < len(s.text) && s.text[i] != '\n'; c++ {
		_, size := utf8.DecodeRuneInString(s.text[i:])
		i += size
	}
	return i
}

func (s *source) nodeOffset(n *yaml.Node) int { return s.offset(n.Line, n.Column) }

// line returns line n (1-based) without its newline.
func (s *source) line(n int) string {
	start := s.lineStarts[n-1]
	end := len(s.text)
	if n < len(s.lineStarts) {
		end = s.lineStarts[n] - 1
	}
	return strings.TrimSuffix(s.text[start:end], "\n")
}

// lineEnd is the offset just past line n's newline (or the end of the text).
func (s *source) lineEnd(n int) int {
	if n < len(s.lineStarts) {
		return s.lineStarts[n]
	}
	return len(s.text)
}

// blockEnd is where the block that starts on line first ends: the offset past the last
// non-blank line of the run of lines after it that are blank or indented more than indent,
// or, with dashes, that start with a sequence item's "-" at indent (a block sequence under a
// mapping key may sit at the key's own column). Comment lines count by their indentation,
// so a comment that belongs to what follows stays with it.
func (s *source) blockEnd(first, indent int, dashes bool) int {
	last := first
	for n := first + 1; n <= len(s.lineStarts); n++ {
		l := s.line(n)
		trimmed := strings.TrimLeft(l, " ")
		if trimmed == "" {
			continue
		}
		in := len(l) - len(trimmed)
		if in > indent || dashes && in == indent && (trimmed == "-" || strings.HasPrefix(trimmed, "- ")) {
			last = n
			continue
		}
		break
	}
	return s.lineEnd(last)
}

// entryEnd is where a mapping entry (key k, value v) ends.
func (s *source) entryEnd(k, v *yaml.Node) int {
	return s.blockEnd(k.Line, k.Column-1, v.Kind == yaml.SequenceNode && v.Style&yaml.FlowStyle == 0)
}

// dashColumn is the 0-based column of the "-" that opens sequence item n.
func (s *source) dashColumn(n *yaml.Node) (int, error) {
	before := s.text[s.lineStarts[n.Line-1]:s.nodeOffset(n)]
	trimmed := strings.TrimRight(before, " ")
	if !strings.HasSuffix(trimmed, "-") || strings.TrimLeft(trimmed[:len(trimmed)-1], " ") != "" {
		return 0, fmt.Errorf("line %d: taskgen edits block sequences written one item per \"- \" line", n.Line)
	}
	return len(trimmed) - 1, nil
}

// itemEnd is where sequence item n ends.
func (s *source) itemEnd(n *yaml.Node) (int, error) {
	dash, err := s.dashColumn(n)
	if err != nil {
		return 0, err
	}
	return s.blockEnd(n.Line, dash, false), nil
}

// scalarEnd is where a scalar written on one line ends: its closing quote, or for a plain
// scalar the last character before a comment or the end of the line.
func (s *source) scalarEnd(n *yaml.Node) (int, error) {
	start := s.nodeOffset(n)
	lineEnd := s.lineEnd(n.Line)
	rest := strings.TrimSuffix(s.text[start:lineEnd], "\n")
	end := -1
	switch {
	case n.Style&yaml.DoubleQuotedStyle != 0:
		for i := 1; i < len(rest); i++ {
			if rest[i] == '\\' {
				i++
				continue
			}
			if rest[i] == '"' {
				end = i + 1
				break
			}
		}
	case n.Style&yaml.SingleQuotedStyle != 0:
		for i := 1; i < len(rest); i++ {
			if rest[i] == '\'' {
				if i+1 < len(rest) && rest[i+1] == '\'' {
					i++
					continue
				}
				end = i + 1
				break
			}
		}
	case n.Style&(yaml.LiteralStyle|yaml.FoldedStyle) == 0:
		plain := rest
		if i := strings.Index(plain, " #"); i >= 0 {
			plain = plain[:i]
		}
		end = len(strings.TrimRight(plain, " \t"))
	}
	if end < 0 {
		return 0, fmt.Errorf("line %d: taskgen edits this value only when it is written on one line", n.Line)
	}
	// The text found must be the value the parser read, or the edit would land elsewhere.
	var check yaml.Node
	if err := yaml.Unmarshal([]byte(rest[:end]), &check); err != nil || len(check.Content) != 1 || check.Content[0].Value != n.Value {
		return 0, fmt.Errorf("line %d: taskgen edits this value only when it is written on one line", n.Line)
	}
	return start + end, nil
}

func (s *source) replace(at, end int, text string) {
	s.edits = append(s.edits, edit{at: at, end: end, text: text})
}

func (s *source) insert(at int, text string) { s.replace(at, at, text) }

// result applies the edits. Edits never overlap; insertions at one offset keep the order
// they were made in.
func (s *source) result() (string, error) {
	edits := append([]edit(nil), s.edits...)
	sort.SliceStable(edits, func(i, j int) bool { return edits[i].at < edits[j].at })
	var b strings.Builder
	pos := 0
	for _, e := range edits {
		if e.at < pos {
			return "", fmt.Errorf("taskgen made overlapping edits at byte %d; this is a bug in taskgen", e.at)
		}
		b.WriteString(s.text[pos:e.at])
		b.WriteString(e.text)
		pos = e.end
	}
	b.WriteString(s.text[pos:])
	out := b.String()
	if s.noFinalNewline && (len(edits) == 0 || edits[len(edits)-1].end < len(s.text)) {
		out = strings.TrimSuffix(out, "\n")
	}
	return out, nil
}

// get returns the key and value nodes of key in mapping m, or nils.
func get(m *yaml.Node, key string) (k, v *yaml.Node) {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil, nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i], m.Content[i+1]
		}
	}
	return nil, nil
}

// indented prefixes every non-empty line of lines with n spaces and joins them, each ending
// in a newline.
func indented(n int, lines []string) string {
	var b strings.Builder
	pad := strings.Repeat(" ", n)
	for _, l := range lines {
		if l != "" {
			b.WriteString(pad)
			b.WriteString(l)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// quoted is s as a YAML scalar: plain where that reads back as the same string, quoted
// otherwise.
func quoted(s string) string {
	out, err := yaml.Marshal(s)
	if err != nil { // a string always marshals
		panic(err)
	}
	return strings.TrimSuffix(string(out), "\n")
}
