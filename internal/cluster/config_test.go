package cluster

import (
	"bytes"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/farmem/farmem/internal/cluster/memnet"
	"github.com/hashicorp/memberlist"
	"github.com/stretchr/testify/require"
)

func TestDefaultConfigIsValid(t *testing.T) {
	c := DefaultConfig()
	require.NoError(t, c.Validate())
	require.Equal(t, DefaultPort, c.BindPort)
	require.Equal(t, ProfileLAN, c.Profile)
	require.NotEmpty(t, c.Name)
}

func TestConfigValidate(t *testing.T) {
	tr, err := memnet.New(0).NewTransport("t")
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		edit func(*Config)
		msg  string // "" means valid
	}{
		{"zero overrides keep the profile", func(*Config) {}, ""},
		{"port 0 picks a free port", func(c *Config) { c.BindPort = 0 }, ""},
		{"empty name", func(c *Config) { c.Name = "" }, "Name is empty"},
		{"long name", func(c *Config) { c.Name = strings.Repeat("n", 129) }, "at most 128"},
		{"bind addr not an IP", func(c *Config) { c.BindAddr = "localhost" }, "BindAddr"},
		{"bind port out of range", func(c *Config) { c.BindPort = 70000 }, "BindPort"},
		{"bind fields ignored with a transport", func(c *Config) { c.BindAddr, c.BindPort, c.Transport = "x", -1, tr }, ""},
		{"advertise addr", func(c *Config) { c.AdvertiseAddr = "host.example" }, "AdvertiseAddr"},
		{"advertise port", func(c *Config) { c.AdvertisePort = -1 }, "AdvertisePort"},
		{"seed without port", func(c *Config) { c.Join = []string{"10.0.0.1"} }, "Join seed"},
		{"profile", func(c *Config) { c.Profile = "LAN" }, "Profile"},
		{"local profile", func(c *Config) { c.Profile = ProfileLocal }, ""},
		{"wan profile", func(c *Config) { c.Profile = ProfileWAN }, ""},
		{"negative duration", func(c *Config) { c.GossipInterval = -time.Second }, "GossipInterval"},
		{"negative suspicion", func(c *Config) { c.SuspicionMult = -1 }, "SuspicionMult"},
		{"negative retransmit", func(c *Config) { c.RetransmitMult = -1 }, "RetransmitMult"},
		{"negative buffer", func(c *Config) { c.EventBuffer = -1 }, "EventBuffer"},
		{"probe timeout not below interval", func(c *Config) { c.ProbeTimeout = 2 * time.Second }, "ProbeTimeout 2s must be shorter than ProbeInterval 1s"},
		{"override fixes it", func(c *Config) { c.ProbeTimeout, c.ProbeInterval = 2*time.Second, 3*time.Second }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Name = "n"
			tc.edit(&c)
			err := c.Validate()
			if tc.msg == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrInvalidConfig)
			require.Contains(t, err.Error(), tc.msg)
		})
	}
}

func TestConfigOverrides(t *testing.T) {
	c := Config{Profile: ProfileWAN, ProbeInterval: 7 * time.Second, SuspicionMult: 9, GossipToTheDeadTime: time.Hour}
	ml := c.profile()
	c.override(ml)
	want := memberlist.DefaultWANConfig()
	require.Equal(t, 7*time.Second, ml.ProbeInterval)
	require.Equal(t, 9, ml.SuspicionMult)
	require.Equal(t, time.Hour, ml.GossipToTheDeadTime)
	require.Equal(t, want.ProbeTimeout, ml.ProbeTimeout, "zero keeps the profile's value")
	require.Equal(t, want.GossipInterval, ml.GossipInterval)
	require.True(t, ml.EnableCompression, "compression stays on unless NoCompression")
	c.NoCompression = true
	c.override(ml)
	require.False(t, ml.EnableCompression)
	require.Equal(t, memberlist.DefaultLANConfig().ProbeInterval, Config{}.profile().ProbeInterval, `"" is lan`)
	require.Equal(t, memberlist.DefaultLocalConfig().ProbeTimeout, Config{Profile: ProfileLocal}.profile().ProbeTimeout)
}

func TestMemberlistLogLevels(t *testing.T) {
	for _, tc := range []struct {
		line  string
		msg   string
		level slog.Level
	}{
		{"[DEBUG] memberlist: Stream connection from=1.2.3.4:7946\n", "Stream connection from=1.2.3.4:7946", slog.LevelDebug},
		{"[INFO] memberlist: Marking n4 as failed\n", "Marking n4 as failed", slog.LevelInfo},
		{"[WARN] memberlist: Refuting a suspect message (from: n1)\n", "Refuting a suspect message (from: n1)", slog.LevelWarn},
		{"[ERR] memberlist: Failed fallback ping\n", "Failed fallback ping", slog.LevelError},
		{"[ERROR] memberlist: x\n", "x", slog.LevelError},
		{"no prefix at all\n", "no prefix at all", slog.LevelInfo},
	} {
		t.Run(tc.msg, func(t *testing.T) {
			msg, level := parseLogLine([]byte(tc.line))
			require.Equal(t, tc.msg, msg)
			require.Equal(t, tc.level, level)
		})
	}
	var buf bytes.Buffer
	var drops atomic.Uint64
	l := memberlistLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn})), func() { drops.Add(1) })
	l.Printf("[DEBUG] memberlist: hidden")
	l.Printf("[WARN] memberlist: shown %d", 1)
	require.NotContains(t, buf.String(), "hidden")
	require.Contains(t, buf.String(), `level=WARN msg="shown 1" component=memberlist`)
	require.Zero(t, drops.Load())
	l.Printf("[WARN] memberlist: handler queue full, dropping message (%d) %s", 8, "from=127.1.0.2:7946")
	require.Equal(t, uint64(1), drops.Load(), "a dropped gossip message is counted")
}
