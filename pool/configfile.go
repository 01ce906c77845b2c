package pool

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/farmem/farmem/internal/size"
)

// configKeys maps each YAML key of Config to its field index.
var configKeys = func() map[string]int {
	keys := map[string]int{}
	t := reflect.TypeFor[Config]()
	for i := range t.NumField() {
		if k, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); k != "" && k != "-" {
			keys[k] = i
		}
	}
	return keys
}()

// decodeConfig sets the keys of a YAML document on c, key by key, so that
// an error names the key, its line and what to write instead of the YAML
// library's view of Go types. c is changed only when every key decodes.
func decodeConfig(b []byte, c *Config) error {
	var doc yaml.Node
	if err := yaml.NewDecoder(bytes.NewReader(b)).Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil
		}
		return fmt.Errorf("%s (the file is YAML: one key: value per line)", oneLine(err.Error()))
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return nil
	}
	if root.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: the file must map keys to values, one per line, like 'local-size: 1GiB'", root.Line)
	}
	out := *c
	v := reflect.ValueOf(&out).Elem()
	seen := map[string]int{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		kn, vn := root.Content[i], root.Content[i+1]
		key := kn.Value
		if line, dup := seen[key]; dup {
			return fmt.Errorf("line %d: key %s again (first on line %d); give each key once", kn.Line, key, line)
		}
		seen[key] = kn.Line
		idx, ok := configKeys[key]
		if !ok {
			return fmt.Errorf("line %d: unknown key %s%s", kn.Line, key, suggestKey(key))
		}
		f := v.Field(idx)
		nv := reflect.New(f.Type())
		if err := vn.Decode(nv.Interface()); err != nil {
			return fmt.Errorf("line %d: %s: %s", vn.Line, key, valueHint(f.Type(), vn, err))
		}
		f.Set(nv.Elem())
	}
	*c = out
	return nil
}

// valueHint says what to write for a value of type t that failed to decode.
func valueHint(t reflect.Type, vn *yaml.Node, err error) string {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return oneLine(err.Error()) // the type's own parser explains itself (sizes, latency specs)
	}
	got := vn.Value
	if vn.Kind != yaml.ScalarNode {
		got = map[yaml.Kind]string{yaml.SequenceNode: "a list", yaml.MappingNode: "a mapping", yaml.AliasNode: "an alias"}[vn.Kind]
	} else {
		got = fmt.Sprintf("%q", got)
	}
	var want string
	switch t {
	case reflect.TypeFor[time.Duration]():
		want = "a duration like 10s or 500ms"
	case reflect.TypeFor[size.Size]():
		want = "a size like 1GiB or 512MiB"
	case reflect.TypeFor[IDList]():
		want = "a list of numeric ids like [0, 1000]"
	case reflect.TypeFor[Quotas]():
		want = "identities with a size per tier, like 'default: {rdma: 4GiB}'"
	default:
		switch t.Kind() {
		case reflect.Bool:
			want = "true or false"
		case reflect.Int, reflect.Int64, reflect.Int32, reflect.Uint32, reflect.Uint64:
			want = "a whole number"
		case reflect.Slice:
			want = "a list like [a, b]"
		default:
			want = "one value"
		}
	}
	return fmt.Sprintf("write %s, not %s", want, got)
}

// suggestKey is "; did you mean K?" for the known key nearest to key, when
// one is near enough to be a typo, and a pointer to the list otherwise.
func suggestKey(key string) string {
	best, bestD := "", len(key)/3+2
	for k := range configKeys {
		if d := editDistance(key, k); d < bestD || d == bestD && k < best {
			best, bestD = k, d
		}
	}
	if best == "" {
		return " (the keys are poold's flag names: see poold --help)"
	}
	return "; did you mean " + best + "?"
}

// editDistance is the Levenshtein distance between a and b in bytes.
func editDistance(a, b string) int {
	prev, cur := make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// oneLine joins a multi-line message into one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
}
