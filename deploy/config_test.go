package deploy

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.yaml.in/yaml/v3"

	"github.com/farmem/farmem/pool"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// configKeys lists the YAML keys of pool.Config, from its struct tags, so
// that a new field is checked without anyone remembering to list it here.
func configKeys(t *testing.T) []string {
	t.Helper()
	var keys []string
	typ := reflect.TypeFor[pool.Config]()
	for f := range typ.Fields() {
		if !f.IsExported() {
			continue
		}
		key, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		require.NotEmpty(t, key, "pool.Config.%s has no yaml tag: every setting needs a key", f.Name)
		require.NotEqual(t, "-", key, "pool.Config.%s is not settable from the file", f.Name)
		keys = append(keys, key)
	}
	require.NotEmpty(t, keys)
	return keys
}

// enableCommented turns "#key: value" lines on, for the keys given: the
// example's way of showing settings that a lone daemon leaves off.
func enableCommented(src string, keys []string) string {
	quoted := make([]string, len(keys))
	for i, k := range keys {
		quoted[i] = regexp.QuoteMeta(k)
	}
	re := regexp.MustCompile(`(?m)^#((?:` + strings.Join(quoted, "|") + `):)`)
	return re.ReplaceAllString(src, "$1")
}

// topKeys returns the top-level mapping keys of a YAML document with the
// comment written above each.
func topKeys(t *testing.T, src []byte) map[string]string {
	t.Helper()
	var doc yaml.Node
	require.NoError(t, yaml.Unmarshal(src, &doc))
	require.Equal(t, yaml.DocumentNode, doc.Kind)
	m := doc.Content[0]
	require.Equal(t, yaml.MappingNode, m.Kind, "the configuration is a mapping")
	out := map[string]string{}
	for i := 0; i < len(m.Content); i += 2 {
		out[m.Content[i].Value] = m.Content[i].HeadComment
	}
	return out
}

func TestExampleConfig(t *testing.T) {
	keys := configKeys(t)
	const path = "poold.yaml"
	raw, err := os.ReadFile(path)
	require.NoError(t, err)

	t.Run("as shipped", func(t *testing.T) {
		cfg, err := pool.LoadConfig(path, pool.DefaultConfig())
		require.NoError(t, err)
		require.NoError(t, cfg.Validate())
		require.Empty(t, cfg.Gossip, "the active settings run a lone daemon")
	})

	enabled := []byte(enableCommented(string(raw), keys))
	t.Run("commented settings turned on", func(t *testing.T) {
		cfg, err := pool.ParseConfig(enabled, pool.DefaultConfig())
		require.NoError(t, err, "each key appears once, either set or as #key:")
		require.NoError(t, cfg.Validate())
		require.NotEmpty(t, cfg.Gossip, "the commented settings show a cluster")
	})

	present := topKeys(t, enabled)
	for _, k := range keys {
		t.Run(k, func(t *testing.T) {
			comment, ok := present[k]
			require.True(t, ok, "deploy/poold.yaml does not show key %q of pool.Config: add it, with a comment saying what it does and its default", k)
			require.NotEmpty(t, strings.TrimSpace(comment), "key %q has no comment above it", k)
		})
	}
	for k := range present {
		require.Contains(t, keys, k, "deploy/poold.yaml shows %q, which pool.Config does not have", k)
	}
}

func TestEnableCommented(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"#listen: a:1\n", "listen: a:1\n"},
		{"# listen: a:1\n", "# listen: a:1\n"},   // prose, not a setting
		{"#listener: a:1\n", "#listener: a:1\n"}, // not a key
		{"  #listen: a:1\n", "  #listen: a:1\n"}, // not at the top level
		{"x: 1\n#join: [a:1]\n", "x: 1\njoin: [a:1]\n"},
	} {
		require.Equal(t, tc.want, enableCommented(tc.in, []string{"listen", "join"}), tc.in)
	}
}
