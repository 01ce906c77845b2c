package newcomer

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var (
	// codeSpan is a `code span`.
	codeSpan = regexp.MustCompile("`[^`\n]+`")
	testName = regexp.MustCompile(`\b(?:Test|Fuzz|Benchmark)[A-Z0-9_]\w*`)
	testFunc = regexp.MustCompile(`(?m)^func ((?:Test|Fuzz|Benchmark)\w*)\(`)
	// goCmd is a go run/test/build command and the rest of its line; pkgArg
	// a ./path argument in it.
	goCmd  = regexp.MustCompile(`\bgo (?:run|test|build)\b[^\n` + "`" + `]*`)
	pkgArg = regexp.MustCompile(`(?:^|\s)(\./[\w./-]*)`)
)

// docs are the files whose commands and test names a newcomer reads.
func docs(t *testing.T, root string) map[string]string {
	t.Helper()
	names := []string{"README.md", "lab/README.md"}
	for _, glob := range []string{"docs/*.md", "examples/*/README.md"} {
		m, err := filepath.Glob(filepath.Join(root, glob))
		require.NoError(t, err)
		for _, p := range m {
			rel, _ := filepath.Rel(root, p)
			names = append(names, rel)
		}
	}
	out := map[string]string{}
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(root, n))
		require.NoError(t, err)
		out[n] = string(b)
	}
	return out
}

// TestReadmeReferencesExist checks that every test the README and docs/
// name in backticks exists, that every package path a go run, go test or
// go build there names exists, that a go build of several packages says
// where to put them (-o), and that the binaries the README builds into the
// checkout are git-ignored.
func TestReadmeReferencesExist(t *testing.T) {
	root := checkout(t)
	files, err := exec.Command("git", "-C", root, "ls-files", "--cached", "--others", "--exclude-standard", "*_test.go").Output()
	require.NoError(t, err)
	defined := map[string]bool{}
	for _, f := range strings.Fields(string(files)) {
		b, err := os.ReadFile(filepath.Join(root, f))
		if os.IsNotExist(err) {
			continue
		}
		require.NoError(t, err)
		for _, m := range testFunc.FindAllStringSubmatch(string(b), -1) {
			defined[m[1]] = true
		}
	}
	require.True(t, defined["TestReadmeReferencesExist"], "the scan finds this test itself")

	for name, text := range docs(t, root) {
		named := 0
		if name == "README.md" || strings.HasPrefix(name, "docs/") {
			for _, span := range codeSpan.FindAllString(text, -1) {
				for _, test := range testName.FindAllString(span, -1) {
					named++
					require.True(t, defined[test], "%s names %s, which no _test.go file defines", name, test)
				}
			}
		}
		if name == "README.md" {
			require.Positive(t, named, "README.md names the tests behind its promises")
		}
		for _, line := range goCmd.FindAllString(text, -1) {
			line, _, _ = strings.Cut(line, "&&")
			line, _, _ = strings.Cut(line, "#")
			var pkgs []string
			for _, m := range pkgArg.FindAllStringSubmatch(line, -1) {
				p := strings.TrimSuffix(strings.TrimSuffix(m[1], "..."), "/")
				pkgs = append(pkgs, p)
				fi, err := os.Stat(filepath.Join(root, p))
				require.NoError(t, err, "%s: %q names %s, which is not in the repository", name, line, m[1])
				require.True(t, fi.IsDir(), "%s: %q names %s, which is not a package directory", name, line, m[1])
			}
			if strings.HasPrefix(line, "go build") && (len(pkgs) > 1 || strings.Contains(line, "/...")) {
				require.Regexp(t, `\s-o\s`, line, "%s: %q builds several packages without -o, which discards the binaries", name, line)
			}
		}
	}

	out, err := exec.Command("git", "-C", root, "check-ignore", "--no-index", "poold", "memctl").CombinedOutput()
	require.NoError(t, err, "the binaries the README builds into the checkout must be git-ignored: %s", out)
}
