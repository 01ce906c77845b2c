package cluster

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWriteFuzzSeeds writes fuzzSeeds to testdata/fuzz/FuzzDecodeMeta and
// capacitySeeds to testdata/fuzz/FuzzDecodeCapacity when CLUSTER_WRITE_SEEDS
// is set, and otherwise checks that the committed corpus holds every one of
// them.
func TestWriteFuzzSeeds(t *testing.T) {
	for target, seeds := range map[string][][]byte{"FuzzDecodeMeta": fuzzSeeds(), "FuzzDecodeCapacity": capacitySeeds(), "FuzzDecodeBatch": batchSeeds()} {
		dir := filepath.Join("testdata", "fuzz", target)
		for _, s := range seeds {
			name := fmt.Sprintf("seed-%x", sha256.Sum256(s))[:21]
			body := "go test fuzz v1\n[]byte(" + strconv.Quote(string(s)) + ")\n"
			path := filepath.Join(dir, name)
			if os.Getenv("CLUSTER_WRITE_SEEDS") != "" {
				require.NoError(t, os.MkdirAll(dir, 0o755))
				require.NoError(t, os.WriteFile(path, []byte(body), 0o644))
				continue
			}
			got, err := os.ReadFile(path)
			require.NoError(t, err, "seed corpus out of date; run CLUSTER_WRITE_SEEDS=1 go test -run TestWriteFuzzSeeds")
			require.Equal(t, body, string(got))
		}
	}
}
