//go:build !(linux && cgo && verbs)

package verbs_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/internal/verbs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStubNotSupported(t *testing.T) {
	_, err := verbs.Dial(t.Context(), "127.0.0.1:1", nil)
	require.ErrorIs(t, err, rdma.ErrNotSupported)
	_, err = verbs.NewServer("mlx5_0")
	require.ErrorIs(t, err, rdma.ErrNotSupported)
	require.Equal(t, "verbs", verbs.Transport{}.Name())
}
