//go:build !(linux && cgo && verbs)

package verbs_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/internal/verbs"
)

func TestStubNotSupported(t *testing.T) {
	_, err := verbs.Dial(t.Context(), "127.0.0.1:1", nil)
	require.ErrorIs(t, err, rdma.ErrNotSupported)
	_, err = verbs.NewServer(verbs.Config{})
	require.ErrorIs(t, err, rdma.ErrNotSupported)
	require.Equal(t, "verbs", verbs.Transport{}.Name())
}
