package web

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

// subjects binds each provider user name to the first subject (the ID
// token's sub) that signed in with it, in memory and, with a state
// directory, in a file read again at start. A provider's user name is
// not unique or stable (renamed, recycled, chosen by the user): another
// subject with a bound name is refused, not made the earlier person.
type subjects struct {
	mu    sync.Mutex
	bound map[string]string // folded name → subject
	path  string            // "" keeps them in memory only
}

// subjectsFile is the bindings' file in the state directory: one JSON
// object {"name":..., "sub":...} a line.
const subjectsFile = "web-oidc-subjects"

// maxSubjectLine bounds a line of the file: a name (256 bytes, with its
// namespace) and a subject (255), JSON-escaped.
const maxSubjectLine = 4096

type subjectLine struct {
	Name string `json:"name"`
	Sub  string `json:"sub"`
}

// loadSubjects reads the bindings kept in dir ("" for none). Lines it
// cannot read are skipped; of two for one name, the first holds.
func loadSubjects(dir string) (*subjects, error) {
	b := &subjects{bound: map[string]string{}}
	if dir == "" {
		return b, nil
	}
	b.path = filepath.Join(dir, subjectsFile)
	f, err := os.Open(b.path)
	if errors.Is(err, fs.ErrNotExist) {
		return b, nil
	}
	if err != nil {
		return nil, fmt.Errorf("web: reading the provider users' subjects: %w", err)
	}
	defer f.Close()
	err = eachLine(f, maxSubjectLine, func(line string) {
		var l subjectLine
		if json.Unmarshal([]byte(line), &l) != nil || l.Name == "" || l.Sub == "" {
			return
		}
		if _, ok := b.bound[foldName(l.Name)]; !ok {
			b.bound[foldName(l.Name)] = l.Sub
		}
	})
	if err != nil {
		return nil, fmt.Errorf("web: reading %s: %w", b.path, err)
	}
	return b, nil
}

// bind binds name to sub unless it is bound to another subject, which it
// returns; "" when name is (now) sub's. The error says the binding could
// not be kept on disk (it holds in memory all the same).
func (b *subjects) bind(name, sub string) (other string, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	key := foldName(name)
	if have, ok := b.bound[key]; ok {
		if have != sub {
			return have, nil
		}
		return "", nil
	}
	b.bound[key] = sub
	if b.path == "" {
		return "", nil
	}
	line, _ := json.Marshal(subjectLine{Name: name, Sub: sub})
	if err := appendLine(b.path, string(line)); err != nil {
		return "", fmt.Errorf("web: keeping a provider user's subject: %w", err)
	}
	return "", nil
}

// holds reports whether name is not bound to a subject other than sub.
func (b *subjects) holds(name, sub string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	have, ok := b.bound[foldName(name)]
	return !ok || have == sub
}

// plainUserName reports whether a provider's user name is one the
// portal takes as a name: letters, digits and marks with . _ or -,
// starting with a letter or digit, in Unicode compatibility form. No @,
// \ or / (which a broker reads as a domain), no spaces or invisible
// characters, no look-alike forms: a name that shows as one user's must
// be theirs.
func plainUserName(u string) bool {
	if u == "" || len(u) > 256 || !norm.NFKC.IsNormalString(u) {
		return false
	}
	for i, c := range u {
		switch {
		case unicode.IsLetter(c) || unicode.IsDigit(c):
		case i > 0 && (unicode.IsMark(c) || strings.ContainsRune("._-", c)):
		default:
			return false
		}
	}
	return true
}
