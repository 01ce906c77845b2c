package testfs

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// SysfsSwitch is a sysfs root that a test switches between fixture trees
// at once (a symlink replaced by rename), as a kernel's tree changes when
// a CXL region or DAX device is created or destroyed. Not safe for
// concurrent Set calls.
type SysfsSwitch struct {
	t    testing.TB
	dir  string // holds the link
	link string
}

// NewSysfsSwitch makes a root showing the fixture tree cxl/testdata/<tree>.
func NewSysfsSwitch(t testing.TB, tree string) *SysfsSwitch {
	t.Helper()
	dir := t.TempDir()
	s := &SysfsSwitch{t: t, dir: dir, link: filepath.Join(dir, "sys")}
	s.Set(tree)
	return s
}

// Root is the path to pass as the sysfs root.
func (s *SysfsSwitch) Root() string { return s.link }

// Set makes the root show the fixture tree cxl/testdata/<tree>.
func (s *SysfsSwitch) Set(tree string) {
	s.t.Helper()
	_, file, _, ok := runtime.Caller(0)
	require.True(s.t, ok)
	abs := filepath.Join(filepath.Dir(file), "../../cxl/testdata", tree)
	_, err := os.Stat(abs)
	require.NoError(s.t, err, "fixture tree %s", tree)
	tmp := filepath.Join(s.dir, "sys.new")
	os.Remove(tmp)
	require.NoError(s.t, os.Symlink(abs, tmp))
	require.NoError(s.t, os.Rename(tmp, s.link))
}
