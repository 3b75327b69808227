package testutil

import (
	"os"
	"path/filepath"
)

// RepoDir is the repository's root, the folder of go.work: where a test finds the tree's files (docs,
// go.mod files, the lint configuration) whatever package it runs in. It is found from the test's working
// directory (go test runs a test in its package's folder), so it holds under -trimpath too; "" when no
// folder above holds go.work.
var RepoDir = func() string {
	wd, err := os.Getwd()
	if err != nil {
		return ""
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.work")); err == nil {
			return d
		}
		if d == filepath.Dir(d) {
			return ""
		}
	}
}()
