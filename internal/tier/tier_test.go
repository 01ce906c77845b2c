package tier_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/tier"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRoundTrip: every tier prints in lower case and parses back from any
// letter case.
func TestRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		tier poolv1.Tier
		name string
	}{
		{poolv1.Tier_TIER_UNSPECIFIED, "any"},
		{poolv1.Tier_TIER_LOCAL, "local"},
		{poolv1.Tier_TIER_CXL, "cxl"},
		{poolv1.Tier_TIER_RDMA, "rdma"},
	} {
		require.Equal(t, tc.name, tier.Name(tc.tier))
		for _, s := range []string{tc.name, strings.ToUpper(tc.name), strings.ToUpper(tc.name[:1]) + tc.name[1:]} {
			got, err := tier.Parse(s)
			require.NoError(t, err, s)
			require.Equal(t, tc.tier, got, s)
		}
		if tc.tier != poolv1.Tier_TIER_UNSPECIFIED {
			got, err := tier.ParseMemory(strings.ToUpper(tc.name))
			require.NoError(t, err)
			require.Equal(t, tc.tier, got)
		}
	}
	require.Equal(t, "tier(17)", tier.Name(17))
	require.Equal(t, []string{"any", "local", "cxl", "rdma"}, tier.Names())
	require.Equal(t, []poolv1.Tier{poolv1.Tier_TIER_LOCAL, poolv1.Tier_TIER_CXL, poolv1.Tier_TIER_RDMA}, tier.Memory())
}

// TestUnknown: a name that is not a tier is a typed error that names it and
// the valid tiers, and matches errs.ErrInvalid; "any" is not a tier of
// memory.
func TestUnknown(t *testing.T) {
	for _, tc := range []struct {
		parse func(string) (poolv1.Tier, error)
		in    string
		want  string
	}{
		{tier.Parse, "fast", `unknown tier "fast"; use local, cxl, rdma or any`},
		{tier.Parse, "", `unknown tier ""; use local, cxl, rdma or any`},
		{tier.Parse, " cxl", `unknown tier " cxl"; use local, cxl, rdma or any`},
		{tier.ParseMemory, "any", `unknown tier "any"; use local, cxl or rdma`},
		{tier.ParseMemory, "dram", `unknown tier "dram"; use local, cxl or rdma`},
	} {
		_, err := tc.parse(tc.in)
		require.EqualError(t, err, tc.want)
		require.ErrorIs(t, err, tier.ErrUnknown)
		require.ErrorIs(t, err, errs.ErrInvalid)
		var ue *tier.UnknownError
		require.ErrorAs(t, err, &ue)
		require.Equal(t, tc.in, ue.Name)
	}
}
