package config

import (
	"encoding"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

var (
	durationType = reflect.TypeFor[Duration]()
	secretType   = reflect.TypeFor[Secret]()
	databaseType = reflect.TypeFor[DatabaseURL]()
	textType     = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// checkShape walks the file's nodes beside the Go types they decode into
// and reports each key no section has (with the nearest key it does
// have) and each value of the wrong kind, by YAML path and line and in
// the file's terms: the decoder would name Go types, and stop at the
// first.
func checkShape(doc *yaml.Node) error {
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return nil
	}
	var sc shapeCheck
	top := unalias(doc.Content[0])
	if top.Kind != yaml.MappingNode && !isNull(top) {
		sc.bad("the file", top, "want sections such as gateway: at the top, got %s", describe(top))
	} else {
		sc.walk("", top, reflect.TypeFor[Config]())
	}
	return errors.Join(sc.errs...)
}

type shapeCheck struct {
	errs []error
}

func (sc *shapeCheck) bad(path string, n *yaml.Node, format string, a ...any) {
	sc.errs = append(sc.errs, fmt.Errorf("%s (line %d): %s", path, n.Line, fmt.Sprintf(format, a...)))
}

func (sc *shapeCheck) walk(path string, n *yaml.Node, t reflect.Type) {
	n = unalias(n)
	if isNull(n) {
		return // key: with nothing after it leaves the setting at its default
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == durationType:
		if _, err := time.ParseDuration(n.Value); n.Kind != yaml.ScalarNode || err != nil {
			sc.bad(path, n, "want a duration like 30s, 5m or 8h, got %s", describe(n))
		}
		return
	case t == secretType:
		if n.Kind != yaml.ScalarNode {
			sc.bad(path, n, "want a secret written inline, as env:NAME or as file:PATH, got %s", describe(n))
		}
		return
	case t == databaseType:
		if n.Kind != yaml.ScalarNode {
			sc.bad(path, n, "want a SQLite file path or a postgres:// URL, inline, as env:NAME or as file:PATH, got %s", describe(n))
		}
		return
	}
	if t.Kind() == reflect.Struct && reflect.PointerTo(t).Implements(textType) {
		// An address or prefix (netip) is written as one scalar.
		if n.Kind != yaml.ScalarNode || n.Decode(reflect.New(t).Interface()) != nil {
			sc.bad(path, n, "want %s, got %s", kindName(t), describe(n))
		}
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			sc.bad(path, n, "want a section of keys (name: value), got %s", describe(n))
			return
		}
		sc.section(path, n, t)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			sc.bad(path, n, "want a list ([a, b], or one \"- \" item a line), got %s", describe(n))
			return
		}
		for i, item := range n.Content {
			sc.walk(fmt.Sprintf("%s[%d]", path, i), item, t.Elem())
		}
	case reflect.Map:
		// A map's keys are the operator's own (web.oidc.accounts maps
		// subjects), so only each key's value is checked.
		if n.Kind != yaml.MappingNode {
			sc.bad(path, n, "want a section of keys (name: value), got %s", describe(n))
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			sc.walk(fmt.Sprintf("%s.%s", path, n.Content[i].Value), n.Content[i+1], t.Elem())
		}
	default:
		// The decoder itself judges a scalar, so that what it accepts
		// (0x1F, 1_000, yes for true) stays accepted.
		if n.Kind != yaml.ScalarNode || n.Decode(reflect.New(t).Interface()) != nil {
			sc.bad(path, n, "want %s, got %s", kindName(t), describe(n))
		}
	}
}

// section checks the keys of a mapping against the fields of struct t.
func (sc *shapeCheck) section(path string, n *yaml.Node, t reflect.Type) {
	seen := map[string]int{} // key: the line it was first written on
	fields := map[string]reflect.Type{}
	var names []string
	var collect func(t reflect.Type)
	collect = func(t reflect.Type) {
		for i := range t.NumField() {
			f := t.Field(i)
			name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if f.Anonymous && opts == "inline" && f.Type.Kind() == reflect.Struct {
				collect(f.Type) // an embedded section's keys are this one's
				continue
			}
			if !f.IsExported() || name == "" || name == "-" {
				continue
			}
			fields[name] = f.Type
			names = append(names, name)
		}
	}
	collect(t)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Tag == "!!merge" {
			v = unalias(v)
			merged := []*yaml.Node{v}
			if v.Kind == yaml.SequenceNode {
				merged = v.Content
			}
			for _, m := range merged {
				// Keys written beside a merge override the merged ones.
				if m = unalias(m); m.Kind == yaml.MappingNode {
					sc.section(path, m, t)
				}
			}
			continue
		}
		key := k.Value
		if path != "" {
			key = path + "." + k.Value
		}
		ft, ok := fields[k.Value]
		if !ok {
			if near := nearest(k.Value, names); near != "" {
				sc.bad(key, k, "unknown key; did you mean %s?", near)
			} else if homes := keyHomes(reflect.TypeFor[Config](), "", k.Value); len(homes) > 0 {
				sc.bad(key, k, "unknown key here; %s belongs in %s", k.Value, strings.Join(homes, " or "))
			} else {
				sc.bad(key, k, "unknown key; the keys here are %s", strings.Join(names, ", "))
			}
			continue
		}
		if first, dup := seen[k.Value]; dup {
			sc.bad(key, k, "written twice (first on line %d)", first)
			continue
		}
		seen[k.Value] = k.Line
		sc.walk(key, v, ft)
	}
}

// keyHomes lists the sections of t (at path) that have key, for a key
// written in the wrong one: auth.token_key put under gateway.
func keyHomes(t reflect.Type, path, key string) []string {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		if t.Kind() == reflect.Slice {
			path += "[]"
		}
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t == durationType || t == secretType || t == databaseType {
		return nil
	}
	var homes []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || name == "" || name == "-" {
			continue
		}
		if name == key && path != "" {
			if list, ok := strings.CutSuffix(path, "[]"); ok {
				homes = append(homes, "an entry of "+list)
			} else {
				homes = append(homes, path)
			}
		}
		sub := name
		if path != "" {
			sub = path + "." + name
		}
		homes = append(homes, keyHomes(f.Type, sub, key)...)
	}
	return homes
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// describe says what a node holds in the file's terms.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a section of keys"
	case yaml.SequenceNode:
		return "a list"
	default:
		return fmt.Sprintf("%q", n.Value)
	}
}

// kindName says what a scalar setting of type t is, in the file's terms.
func kindName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	default:
		return "a string"
	}
}

// nearest returns the key of known that key is most likely a misspelling
// of, or "" when none is close: the same but for case, underscores and
// hyphens, else the fewest edits, if few for the key's length.
func nearest(key string, known []string) string {
	fold := strings.NewReplacer("_", "", "-", "")
	norm := strings.ToLower(fold.Replace(key))
	best, bestD := "", len(key)+1
	for _, k := range known {
		if strings.ToLower(fold.Replace(k)) == norm {
			return k
		}
		if d := editDistance(strings.ToLower(key), k); d < bestD {
			best, bestD = k, d
		}
	}
	if bestD <= max(2, len(key)/3) && bestD < len(key) {
		return best
	}
	return ""
}

// editDistance counts the insertions, deletions, substitutions and swaps
// of neighbouring letters that turn a into b (optimal string alignment).
func editDistance(a, b string) int {
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}
