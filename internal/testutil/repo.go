package testutil

import (
	"path/filepath"
	"runtime"
)

// RepoDir is the repository's root, the folder of go.work: where a test finds the tree's files (docs,
// go.mod files, the lint configuration) whatever package it runs in.
var RepoDir = func() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}()
