package certs

import (
	"os"
	"sync"
	"testing"
)

var (
	testMu   sync.Mutex
	testDirs = map[testing.TB]string{}
)

// ForTest returns the files of a certificate for name — a node's (server
// and client use) when node is set, else a client's — signed by a CA made
// once per test: every call with the same tb shares it, so the daemons and
// clients of one test trust each other. The files are removed when the
// test ends. It fails the test on error.
func ForTest(tb testing.TB, name string, node bool) Files {
	tb.Helper()
	testMu.Lock()
	defer testMu.Unlock()
	dir, ok := testDirs[tb]
	if !ok {
		var err error
		if dir, err = os.MkdirTemp("", "farmem-certs"); err != nil {
			tb.Fatal(err)
		}
		testDirs[tb] = dir
		tb.Cleanup(func() {
			testMu.Lock()
			delete(testDirs, tb)
			testMu.Unlock()
			os.RemoveAll(dir)
		})
	}
	o := InitOptions{Clients: []string{name}}
	if node {
		o = InitOptions{Nodes: []Node{{Name: name}}}
	}
	if _, err := Init(dir, o); err != nil {
		tb.Fatal(err)
	}
	return InDir(dir, name)
}
