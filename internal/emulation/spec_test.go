package emulation

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		in        string
		cxl, rdma Target
		str       string
	}{
		{in: "", str: ""},
		{in: "none", str: ""},
		{in: "cxl=200ns", cxl: Target{Latency: 200 * time.Nanosecond}, str: "cxl=200ns"},
		{in: "cxl=200ns,rdma=2us", cxl: Target{Latency: 200}, rdma: Target{Latency: 2 * time.Microsecond}, str: "cxl=200ns,rdma=2µs"},
		{in: " rdma = 2µs/12GB/s , cxl=0.2us", cxl: Target{Latency: 200}, rdma: Target{Latency: 2000, Bandwidth: 12e9}, str: "cxl=200ns,rdma=2µs/12GB/s"},
		{in: "rdma=1ms/800MiB/s", rdma: Target{Latency: time.Millisecond, Bandwidth: 800 << 20}, str: "rdma=1ms/838860800B/s"},
		{in: "CXL=0", str: "cxl=0s"},
	} {
		t.Run(c.in, func(t *testing.T) {
			sp, err := Parse(c.in)
			require.NoError(t, err)
			got, _ := sp.Target(poolv1.Tier_TIER_CXL)
			require.Equal(t, c.cxl, got)
			got, _ = sp.Target(poolv1.Tier_TIER_RDMA)
			require.Equal(t, c.rdma, got)
			require.Equal(t, c.str, sp.String())
			back, err := Parse(sp.String())
			require.NoError(t, err)
			require.Equal(t, sp, back)
		})
	}
}

func TestParseErrors(t *testing.T) {
	for _, c := range []struct{ in, reason, instead string }{
		{"cxl=200", `latency "200" has no unit`, "cxl=200ns"},
		{"200ns", "no TIER=", "cxl=200ns"},
		{"cx1=200ns", `unknown tier "cx1"`, "local, cxl or rdma"},
		{"cxl=200ns,,rdma=2us", "empty item", "single commas"},
		{"cxl=200ns,cxl=300ns", "given twice", "each tier once"},
		{"cxl=-5ns", "negative", "cxl=5ns"},
		{"cxl=2s", "above the 1s limit", "up to 1s"},
		{"cxl=fast", "not a duration", "cxl=200ns"},
		{"cxl=", "no latency", "cxl=200ns"},
		{"rdma=2us/12GB", "does not end in /s", "rdma=2us/12GB/s"},
		{"rdma=2us/100Gb/s", "in bits", "rdma=2us/12500MB/s"},
		{"rdma=2us/100Gbit/s", "in bits", "rdma=2us/12500MB/s"},
		{"rdma=2us/lots/s", "not a number of bytes", "12GB/s"},
		{"rdma=2us/0GB/s", "zero", "without a cap"},
	} {
		t.Run(c.in, func(t *testing.T) {
			_, err := Parse(c.in)
			require.ErrorIs(t, err, ErrSyntax)
			var se *SyntaxError
			require.True(t, errors.As(err, &se))
			require.Contains(t, se.Reason, c.reason)
			require.Contains(t, se.Instead, c.instead)
			require.Contains(t, err.Error(), "write "+se.Instead)
		})
	}
}

func TestOverride(t *testing.T) {
	daemon, err := Parse("cxl=200ns,rdma=2us")
	require.NoError(t, err)
	client, err := Parse("cxl=0,local=100ns")
	require.NoError(t, err)
	got := daemon.Override(client)
	require.Equal(t, "local=100ns,cxl=0s,rdma=2µs", got.String())
	cxl, named := got.Target(poolv1.Tier_TIER_CXL)
	require.True(t, named)
	require.True(t, cxl.Zero())
	require.False(t, got.Zero())
	require.True(t, Spec{}.Zero())
}

func TestTargetDuration(t *testing.T) {
	tg := Target{Latency: 2 * time.Microsecond, Bandwidth: 1e9} // 1 byte per ns
	require.Equal(t, 2*time.Microsecond, tg.Duration(0))
	require.Equal(t, 2*time.Microsecond+4096, tg.Duration(4096))
	require.Equal(t, time.Duration(200), Target{Latency: 200}.Duration(4096))
}

func TestSpecText(t *testing.T) {
	var sp Spec
	require.NoError(t, sp.UnmarshalText([]byte("rdma=2us/12GB/s")))
	b, err := sp.MarshalText()
	require.NoError(t, err)
	require.Equal(t, "rdma=2µs/12GB/s", string(b))
	require.ErrorIs(t, sp.Set("rdma"), ErrSyntax)
	require.Equal(t, "rdma=2µs/12GB/s", sp.String(), "a failed Set keeps the value")
}
