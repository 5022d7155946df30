package config

import (
	"fmt"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// badFunc records a mistake: the YAML path of the key at fault
// (gateway.resource_policies[0].hosts[1]) and what is wrong with it.
type badFunc = func(key, format string, a ...any)

// source is the file's YAML node tree, kept beside the decoded values so
// that a mistake found in a value can name the line it was written on.
type source struct {
	root *yaml.Node
}

// where returns path with the line it is written on, or, for a key the
// file leaves out, the line of the nearest section around it that the
// file has (where the key would go); path alone when there is neither.
func (s *source) where(path string) string {
	line, exact := s.find(path)
	switch {
	case line > 0 && exact:
		return fmt.Sprintf("%s (line %d)", path, line)
	case line > 0:
		return fmt.Sprintf("%s (not set; its section is on line %d)", path, line)
	}
	return path
}

// has reports whether the file itself writes path (not a default).
func (s *source) has(path string) bool {
	_, exact := s.find(path)
	return exact
}

// line is the line of path's key (or list item) in the file, or of the
// nearest enclosing one written there; 0 when none is.
func (s *source) line(path string) int {
	line, _ := s.find(path)
	return line
}

// find returns the line of path, or of the nearest enclosing key written,
// and whether path itself is written.
func (s *source) find(path string) (int, bool) {
	if s == nil || s.root == nil || len(s.root.Content) == 0 {
		return 0, false
	}
	n, line := s.root.Content[0], 0
	for _, step := range splitPath(path) {
		n = unalias(n)
		var next *yaml.Node
		switch {
		case step.index >= 0 && n.Kind == yaml.SequenceNode && step.index < len(n.Content):
			next = n.Content[step.index]
			line = next.Line
		case step.index < 0 && n.Kind == yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				if n.Content[i].Value == step.key {
					next = n.Content[i+1]
					line = n.Content[i].Line
				}
			}
		}
		if next == nil {
			return line, false
		}
		n = next
	}
	return line, true
}

// pathStep is one key of a path, or one list index (key empty).
type pathStep struct {
	key   string
	index int
}

// splitPath reads a path such as a.b[2].c into its steps.
func splitPath(path string) []pathStep {
	var steps []pathStep
	for _, part := range strings.Split(path, ".") {
		name, rest, _ := strings.Cut(part, "[")
		if name != "" {
			steps = append(steps, pathStep{key: name, index: -1})
		}
		for rest != "" {
			num, after, _ := strings.Cut(rest, "]")
			i, err := strconv.Atoi(num)
			if err != nil {
				break
			}
			steps = append(steps, pathStep{index: i})
			rest = strings.TrimPrefix(after, "[")
		}
	}
	return steps
}

// unalias follows YAML aliases (*name) to the node they stand for.
func unalias(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}
