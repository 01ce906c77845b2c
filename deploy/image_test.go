package deploy

import (
	"bufio"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// stage is one FROM ... AS name block of a Dockerfile: its base image and
// its instructions, continuation lines joined.
type stage struct {
	name, base string
	lines      []string
}

// dockerStages parses the Dockerfile's stages in order.
func dockerStages(t *testing.T, file string) []stage {
	t.Helper()
	f, err := os.Open(file)
	require.NoError(t, err)
	defer f.Close()
	var stages []stage
	var cur string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") || line == "" && cur == "" {
			continue
		}
		if rest, ok := strings.CutSuffix(line, `\`); ok {
			cur += rest + " "
			continue
		}
		line, cur = cur+line, ""
		if f := strings.Fields(line); len(f) > 0 && f[0] == "FROM" {
			require.Len(t, f, 4, "%q: every stage is named (FROM image AS name)", line)
			require.Equal(t, "AS", f[2], line)
			stages = append(stages, stage{name: f[3], base: f[1]})
			continue
		}
		require.NotEmpty(t, stages, "%q before the first FROM", line)
		stages[len(stages)-1].lines = append(stages[len(stages)-1].lines, line)
	}
	require.NoError(t, sc.Err())
	return stages
}

// TestDockerfile: the default target is the static image built without
// cgo; the verbs target is built with cgo and -tags verbs against
// libibverbs and runs on the same Debian release with libibverbs and its
// providers; both ship poold and memctl and start poold. (Docker itself is
// not run here: this checks what can be read.)
func TestDockerfile(t *testing.T) {
	stages := dockerStages(t, "Dockerfile")
	byName := map[string]stage{}
	for _, s := range stages {
		require.NotContains(t, byName, s.name, "stage %s twice", s.name)
		byName[s.name] = s
	}
	require.Equal(t, "static", stages[len(stages)-1].name, "a build without --target makes the static image")
	run := func(s stage) string {
		var out []string
		for _, l := range s.lines {
			if strings.HasPrefix(l, "RUN ") {
				out = append(out, l)
			}
		}
		return strings.Join(out, "\n")
	}
	for _, tc := range []struct {
		image, build string
		want         []string
		packages     []string
	}{
		{"static", "build", []string{"CGO_ENABLED=0 go build"}, nil},
		{"verbs", "build-verbs", []string{"CGO_ENABLED=1 go build -tags verbs", "libibverbs-dev"}, []string{"libibverbs1", "ibverbs-providers"}},
	} {
		t.Run(tc.image, func(t *testing.T) {
			img, ok := byName[tc.image]
			require.True(t, ok, "stage %s", tc.image)
			b, ok := byName[tc.build]
			require.True(t, ok, "stage %s", tc.build)
			for _, w := range tc.want {
				require.Contains(t, run(b), w)
			}
			require.Contains(t, run(b), "./cmd/poold ./cmd/memctl")
			for _, p := range tc.packages {
				require.Contains(t, run(img), p, "the run stage installs %s", p)
			}
			require.Contains(t, img.lines, "COPY --from="+tc.build+" /out/poold /out/memctl /usr/local/bin/")
			require.Contains(t, img.lines, `ENTRYPOINT ["/usr/local/bin/poold"]`)
		})
	}
	// The verbs binary links libibverbs dynamically: build and run on one
	// Debian release.
	release := func(image string) string {
		for _, r := range []string{"bookworm", "trixie", "forky"} {
			if strings.Contains(image, r) {
				return r
			}
		}
		t.Fatalf("image %s names no Debian release: pin one, so that build and run stage agree", image)
		return ""
	}
	require.Equal(t, release(byName["build-verbs"].base), release(byName["verbs"].base))
}

// TestSystemdRDMADropIn: the drop-in for a verbs build lets poold open the
// verbs devices and nothing else (CI verifies it with the unit through
// systemd-analyze).
func TestSystemdRDMADropIn(t *testing.T) {
	b, err := os.ReadFile("systemd/poold.service.d/rdma.conf")
	require.NoError(t, err)
	var settings []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			settings = append(settings, l)
		}
	}
	require.Equal(t, []string{"[Service]", "DeviceAllow=char-infiniband_verbs rw"}, settings)
	unit, err := os.ReadFile("systemd/poold.service")
	require.NoError(t, err)
	require.Contains(t, string(unit), "DevicePolicy=closed", "the drop-in adds to a closed device policy")
	require.Contains(t, string(unit), "LimitMEMLOCK=infinity", "verbs registers segment memory")
	require.Contains(t, string(unit), "poold.service.d/rdma.conf", "the unit says where the drop-in is")
}
