package main

import (
	"slices"
	"testing"
)

const table = "# Architecture\n\n## Layers\n\n| layer | packages | its own layer too |\n|---|---|---|\n" +
	"| 0 | `internal/proto/*` `internal/config` | yes |\n" +
	"| 1 | `internal/gateway` `internal/broker` | no: roles never import each other |\n" +
	"| 2 | `internal/bench/*` `internal/bench/echo` | yes |\n\n## Next\n| 9 | `internal/ignored` | yes |\n"

func TestCheckFindsEachKindOfProblem(t *testing.T) {
	layers, err := parseLayers(table)
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 3 {
		t.Fatalf("parsed %d layers, want 3 (the row after the next heading is not the table's)", len(layers))
	}
	got := check(layers, []pkg{
		{path: "internal/proto/x224"},
		{path: "internal/config", imports: []string{"internal/proto/x224"}},
		{path: "internal/gateway", imports: []string{"internal/config", "internal/broker"}},
		{path: "internal/broker", imports: []string{"internal/bench/report"}},
		{path: "internal/bench/load", imports: []string{"internal/bench/echo", "internal/gateway"}},
		{path: "internal/site"},
	})
	want := []string{
		"internal/broker (layer 1) imports internal/bench/report (layer 2): an import running upward",
		"internal/gateway imports internal/broker: packages of layer 1 do not import each other",
		"internal/site is in no layer: add it to the table",
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%q\nwant:\n%q", got, want)
	}
}

func TestExactNameWinsOverFolder(t *testing.T) {
	layers, err := parseLayers(table)
	if err != nil {
		t.Fatal(err)
	}
	if l, _ := place(layers, "internal/bench/echo"); l.rank != 2 {
		t.Errorf("echo placed in layer %d", l.rank)
	}
	if _, ok := place(layers, "internal/protocol"); ok {
		t.Error("internal/protocol matched internal/proto/*")
	}
}

func TestNoTable(t *testing.T) {
	if _, err := parseLayers("# Architecture\n\n## Packages\n"); err == nil {
		t.Error("a document without the section parsed")
	}
}

// The module's own tree holds to its own docs.
func TestTheTreeHoldsToTheDocs(t *testing.T) {
	if err := run("../.."); err != nil {
		t.Error(err)
	}
}
