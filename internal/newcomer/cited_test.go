package newcomer

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// goFile is a Go file name, with or without a directory: deploy/config_test.go, doc.go.
var goFile = regexp.MustCompile(`(?:^|[^\w*./<-])((?:[\w-]+/)*[A-Za-z][\w-]*\.go)\b`)

// TestCitedFilesExist checks that every Go file the tree's text names
// exists: comments in Go code, the docs, the deployment files and scripts
// say "deploy/config_test.go checks this" or "(scale_linux_test.go)", and
// such a pointer must not outlive a rename. A bare file name is looked up
// beside the file that names it, then anywhere in the tree; a path is
// taken from the checkout's root, then from the naming file's directory.
// Another project's file is named with its owner, as in
// memberlist's state.go. It also checks that every test a Go comment, script or manifest names is
// defined, as TestReadmeReferencesExist does for the README and docs.
func TestCitedFilesExist(t *testing.T) {
	root := checkout(t)
	out, err := exec.Command("git", "-C", root, "ls-files", "--cached", "--others", "--exclude-standard").Output()
	require.NoError(t, err)
	tracked := strings.Fields(string(out))
	base := map[string]bool{}
	defined := map[string]bool{}
	for _, f := range tracked {
		base[filepath.Base(f)] = true
		if strings.HasSuffix(f, "_test.go") {
			b, err := os.ReadFile(filepath.Join(root, f))
			if err == nil {
				for _, m := range testFunc.FindAllStringSubmatch(string(b), -1) {
					defined[m[1]] = true
				}
			}
		}
	}
	exists := func(p string) bool {
		_, err := os.Stat(filepath.Join(root, p))
		return err == nil
	}
	checked := 0
	for _, f := range tracked {
		text, ok := citingText(t, root, f)
		if !ok {
			continue
		}
		for _, m := range goFile.FindAllStringSubmatchIndex(text, -1) {
			name := text[m[2]:m[3]]
			if before := text[:m[2]]; strings.HasSuffix(before, "'s `") || strings.HasSuffix(before, "'s ") {
				continue // another project's file: "memberlist's state.go"
			}
			checked++
			found := exists(name) || exists(filepath.Join(filepath.Dir(f), name)) ||
				(!strings.Contains(name, "/") && base[name])
			assert.True(t, found, "%s names %s, which is not in the tree; point it at the file that holds it now", f, name)
		}
		if strings.HasSuffix(f, ".go") || strings.HasSuffix(f, ".yaml") || strings.HasSuffix(f, ".sh") || f == ".ci/run" {
			for _, ix := range testName.FindAllStringIndex(text, -1) {
				if strings.HasSuffix(text[:ix[0]], "<") {
					continue // a placeholder: testdata/fuzz/<FuzzName>/
				}
				test := text[ix[0]:ix[1]]
				assert.True(t, defined[test], "%s names %s, which no _test.go file defines", f, test)
			}
		}
	}
	require.Greater(t, checked, 20, "the scan finds the file names the tree cites")
}

// citingText is the part of tracked file f that cites other files: a Go
// file's comments, or the whole of a doc, manifest or script. ok is false
// for files that cite nothing (data, generated code, fuzz corpora).
func citingText(t *testing.T, root, f string) (string, bool) {
	t.Helper()
	switch {
	case strings.Contains(f, "/testdata/"), strings.HasSuffix(f, ".pb.go"):
		return "", false
	case strings.HasSuffix(f, ".go"):
		b, err := os.ReadFile(filepath.Join(root, f))
		require.NoError(t, err)
		var c strings.Builder
		for _, line := range strings.Split(string(b), "\n") {
			if _, comment, ok := strings.Cut(line, "// "); ok {
				c.WriteString(comment)
				c.WriteByte('\n')
			}
		}
		return c.String(), true
	case strings.HasSuffix(f, ".md"), strings.HasSuffix(f, ".yaml"), strings.HasSuffix(f, ".sh"), f == ".ci/run", filepath.Base(f) == "Dockerfile":
		b, err := os.ReadFile(filepath.Join(root, f))
		require.NoError(t, err)
		return string(b), true
	}
	return "", false
}
