package uevent

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A region's dax device as kernel 6.1 announces it when
// 'cxl create-region -t ram' brings it up (captured in the lab's guest).
const daxAdd = "add@/devices/platform/ACPI0017:00/root0/decoder0.0/region0/dax_region0/dax0.0\x00" +
	"ACTION=add\x00DEVPATH=/devices/platform/ACPI0017:00/root0/decoder0.0/region0/dax_region0/dax0.0\x00" +
	"SUBSYSTEM=dax\x00MAJOR=252\x00MINOR=0\x00DEVNAME=dax0.0\x00SEQNUM=3911\x00"

func TestParse(t *testing.T) {
	ev, err := Parse([]byte(daxAdd))
	require.NoError(t, err)
	require.Equal(t, "add", ev.Action)
	require.Equal(t, "dax", ev.Subsystem)
	require.Equal(t, uint64(3911), ev.Seqnum)
	require.Equal(t, "dax0.0", ev.Env["DEVNAME"])
	require.True(t, strings.HasSuffix(ev.DevPath, "/dax0.0"))

	back, err := Parse(ev.Bytes())
	require.NoError(t, err)
	require.Equal(t, ev, back)

	// A memory block going offline: no trailing NUL is accepted too.
	ev, err = Parse([]byte("offline@/devices/system/memory/memory40\x00ACTION=offline\x00DEVPATH=/devices/system/memory/memory40\x00SUBSYSTEM=memory"))
	require.NoError(t, err)
	require.Equal(t, "memory", ev.Subsystem)
	require.Zero(t, ev.Seqnum)
}

func TestParseMalformed(t *testing.T) {
	for name, msg := range map[string]string{
		"empty":          "",
		"udev":           "libudev\x00\xfe\xed\xca\xfe",
		"no at":          "add/devices/x\x00ACTION=add\x00",
		"relative path":  "add@devices/x\x00",
		"no action":      "@/devices/x\x00",
		"no equals":      "add@/devices/x\x00ACTION\x00",
		"empty key":      "add@/devices/x\x00=add\x00",
		"action differs": "add@/devices/x\x00ACTION=remove\x00",
		"path differs":   "add@/devices/x\x00DEVPATH=/devices/y\x00",
		"seqnum":         "add@/devices/x\x00SEQNUM=12a\x00",
		"too long":       "add@/devices/x\x00K=" + strings.Repeat("v", MaxMessage),
		"too many keys":  "add@/devices/x\x00" + strings.Repeat("K=v\x00", MaxKeys+1),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(msg))
			require.ErrorIs(t, err, ErrMalformed)
		})
	}
}

// FuzzParse: no input panics; what parses encodes and parses back the same.
func FuzzParse(f *testing.F) {
	f.Add([]byte(daxAdd))
	f.Add([]byte("remove@/devices/system/node/node1\x00ACTION=remove\x00DEVPATH=/devices/system/node/node1\x00SUBSYSTEM=node\x00SEQNUM=7\x00"))
	f.Add([]byte("libudev\x00"))
	f.Fuzz(func(t *testing.T, msg []byte) {
		ev, err := Parse(msg)
		if err != nil {
			require.ErrorIs(t, err, ErrMalformed)
			return
		}
		if strings.ContainsRune(ev.Action, 0) || strings.ContainsRune(ev.DevPath, 0) {
			t.Fatalf("field with NUL: %q", msg)
		}
		back, err := Parse(ev.Bytes())
		if err != nil {
			// Only a message near the size limit may grow past it when
			// encoded with all four keys.
			require.Greater(t, len(ev.Bytes()), MaxMessage/2, "%q", msg)
			return
		}
		require.Equal(t, []any{ev.Action, ev.DevPath, ev.Subsystem, ev.Seqnum}, []any{back.Action, back.DevPath, back.Subsystem, back.Seqnum})
		for k, v := range ev.Env {
			switch k {
			case "SUBSYSTEM", "SEQNUM":
			default:
				require.Equal(t, v, back.Env[k], "key %s of %q", k, msg)
			}
		}
	})
}
