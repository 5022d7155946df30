package main

import (
	"strings"
	"testing"
)

func TestSummarize(t *testing.T) {
	const pass = `{"Action":"pass","Package":"p","Test":"TestA"}` + "\n"
	const skip = `{"Action":"skip","Package":"p","Test":"TestB"}` + "\n"
	const fail = `{"Action":"output","Package":"p","Test":"TestC","Output":"boom\n"}` + "\n" +
		`{"Action":"fail","Package":"p","Test":"TestC"}` + "\n"
	for _, c := range []struct {
		name, in string
		ci       bool
		code     int
		line     string
	}{
		{"all pass", pass, true, 0, "1 passed, 0 failed, 0 skipped"},
		{"a skip outside CI", pass + skip, false, 0, "1 passed, 0 failed, 1 skipped"},
		{"a skip in CI", pass + skip, true, 1, "1 passed, 0 failed, 1 skipped"},
		{"a failure", pass + fail, false, 1, "1 passed, 1 failed, 0 skipped"},
		{"a build error", "# p\nx.go:1: undefined: y\n" + pass, false, 1, "1 passed, 0 failed, 0 skipped"},
	} {
		var w strings.Builder
		if code := summarize(strings.NewReader(c.in), &w, c.ci); code != c.code || !strings.Contains(w.String(), c.line) {
			t.Errorf("%s: exit %d, want %d; output:\n%s", c.name, code, c.code, w.String())
		}
	}
}
