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
