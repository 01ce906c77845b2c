package newcomer

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
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

// codeRef is a `dir.Name` or `dir.Type.Method` code span of
// docs/ARCHITECTURE.md: dir is a package directory of this module.
var codeRef = regexp.MustCompile("`([a-z][a-z0-9_/]*)\\.([A-Za-z_]\\w*)(?:\\.([A-Za-z_]\\w*))?`")

// fileExt are the extensions of file names the page mentions.
var fileExt = map[string]bool{"go": true, "proto": true, "md": true, "yaml": true, "sh": true}

// TestArchitectureNamesExist checks that every function, type and method
// docs/ARCHITECTURE.md names as a hop (`alloc.Client.Alloc`,
// `rdma/tcp.Client.Post`) is declared in that package's non-test files,
// so the page a newcomer follows cannot drift from the code.
func TestArchitectureNamesExist(t *testing.T) {
	root := checkout(t)
	page, err := os.ReadFile(filepath.Join(root, "docs", "ARCHITECTURE.md"))
	require.NoError(t, err)
	decls := map[string]map[string]bool{}
	resolved := 0
	for _, m := range codeRef.FindAllStringSubmatch(string(page), -1) {
		dir, name, method := m[1], m[2], m[3]
		if fileExt[name] {
			continue // a file name: pool.proto
		}
		if _, err := os.Stat(filepath.Join(root, dir)); err != nil {
			dir = "internal/" + dir // named as its package is: extent, fdpass
			if _, err := os.Stat(filepath.Join(root, dir)); err != nil {
				continue // another module's package
			}
		}
		if decls[dir] == nil {
			decls[dir] = declared(t, filepath.Join(root, dir))
		}
		want := name
		if method != "" {
			want = name + "." + method
		}
		resolved++
		assert.True(t, decls[dir][want], "docs/ARCHITECTURE.md names %s.%s, which package %s does not declare", dir, want, dir)
	}
	require.Greater(t, resolved, 20, "the page names the functions on its paths")
}

// declared lists the top-level names of the Go package in dir (its
// non-test files): functions, types, variables, constants, and methods as
// "Type.Method", an interface's methods included.
func declared(t *testing.T, dir string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	require.NoError(t, err)
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		for _, d := range af.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					out[d.Name.Name] = true
					continue
				}
				typ := d.Recv.List[0].Type
				if s, ok := typ.(*ast.StarExpr); ok {
					typ = s.X
				}
				if g, ok := typ.(*ast.IndexExpr); ok {
					typ = g.X
				}
				if id, ok := typ.(*ast.Ident); ok {
					out[id.Name+"."+d.Name.Name] = true
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						out[s.Name.Name] = true
						if it, ok := s.Type.(*ast.InterfaceType); ok {
							for _, f := range it.Methods.List {
								for _, n := range f.Names {
									out[s.Name.Name+"."+n.Name] = true
								}
							}
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							out[n.Name] = true
						}
					}
				}
			}
		}
	}
	return out
}

// TestImportLayering checks the layering docs/ARCHITECTURE.md draws: the
// client library (alloc) and the daemon (pool) never import each other;
// the transports, the shared internals and the discovery code import
// neither; only commands, examples and test harnesses sit above both.
func TestImportLayering(t *testing.T) {
	root := checkout(t)
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	require.NoError(t, err)
	const mod = "github.com/farmem/farmem/"
	above := []string{"cmd/", "examples/", "lab/", "internal/embedded", "internal/pooltest", "internal/newcomer"}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], mod)
		top := false
		for _, a := range above {
			top = top || strings.HasPrefix(pkg, a)
		}
		for _, imp := range fields[1:] {
			imp, ok := strings.CutPrefix(imp, mod)
			if !ok {
				continue
			}
			switch {
			case pkg == "alloc" || strings.HasPrefix(pkg, "alloc/"):
				assert.False(t, imp == "pool" || strings.HasPrefix(imp, "pool/"), "the client library %s imports the daemon %s", pkg, imp)
			case pkg == "pool" || strings.HasPrefix(pkg, "pool/"):
				assert.False(t, imp == "alloc" || strings.HasPrefix(imp, "alloc/"), "the daemon %s imports the client library %s", pkg, imp)
			case !top:
				assert.False(t, imp == "alloc" || imp == "pool" || strings.HasPrefix(imp, "cmd/"),
					"%s sits below the client and the daemon, yet imports %s", pkg, imp)
			}
		}
	}
}
