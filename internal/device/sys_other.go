//go:build !linux

package device

import (
	"os"
	"runtime"
)

// supported reports that no device works outside Linux.
func supported(what string) error {
	return &notSupportedError{feature: what, reason: "farmem devices need Linux (memfd, mbind, devdax); this is " + runtime.GOOS}
}

func statFS(string) (fsInfo, error) { return fsInfo{}, supported("statfs") }

// IsNoSpace reports whether err means the filesystem or a quota is full.
func IsNoSpace(error) bool { return false }

func reserve(*os.File, int64) error { return supported("fallocate") }

func createMemfd(string, int64) (*os.File, error) { return nil, supported("memfd") }

func dupFile(*os.File) (*os.File, error) { return nil, supported("dup") }

func lockFile(string) (*os.File, error) { return nil, supported("flock") }

func mmapFile(*os.File, int64, int64, bool) ([]byte, error) { return nil, supported("shared mappings") }

func mbind([]byte, int) error { return supported("mbind") }

func probeNode(int) error { return supported("NUMA binding") }

func populate([]byte, int) error { return supported("populate") }

func pagesOnNode([]byte) (map[int]int, error) { return nil, supported("move_pages") }
