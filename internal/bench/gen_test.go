package bench

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/bench/benchtest"
)

func TestCaseCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Case
		ok   bool
	}{
		{"read", Case{Op: Read, Size: 4096, Depth: 16}, true},
		{"atomic", Case{Op: Atomic, Size: 8, Depth: 1}, true},
		{"count only", Case{Op: Write, Size: 64, Depth: 1, Count: 10}, true},
		{"unknown op", Case{Op: "scan", Size: 64, Depth: 1}, false},
		{"atomic of 16", Case{Op: Atomic, Size: 16, Depth: 1}, false},
		{"zero size", Case{Op: Read, Depth: 1}, false},
		{"huge size", Case{Op: Read, Size: 32 << 20, Depth: 1}, false},
		{"zero depth", Case{Op: Read, Size: 64}, false},
		{"depth over keys", Case{Op: Read, Size: 64, Depth: Keys + 1}, false},
		{"negative duration", Case{Op: Read, Size: 64, Depth: 1, Duration: -1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.c
			err := c.check()
			if tc.ok {
				require.NoError(t, err)
				require.Positive(t, c.Warmup)
				return
			}
			require.ErrorIs(t, err, ErrInvalid)
		})
	}
}

// sliceSegment is a Segment in a plain slice that records which keys'
// bytes were touched concurrently.
type sliceSegment struct {
	mu  sync.Mutex
	mem []byte
}

func (s *sliceSegment) ReadAt(p []byte, off int64) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if off+int64(len(p)) > int64(len(s.mem)) {
		return 0, io.EOF
	}
	return copy(p, s.mem[off:]), nil
}

func (s *sliceSegment) WriteAt(p []byte, off int64) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return copy(s.mem[off:], p), nil
}

func (s *sliceSegment) Add64(off int64, d uint64) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := binary.LittleEndian.Uint64(s.mem[off:]) + d
	binary.LittleEndian.PutUint64(s.mem[off:], v)
	return v, nil
}

func (s *sliceSegment) Size() int64 { return int64(len(s.mem)) }

// failing fails its Nth op.
type failing struct {
	Memory
	mu sync.Mutex
	n  int
}

func (f *failing) Do(ctx context.Context, op Op, key int, buf []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n--; f.n == 0 {
		return errors.New("boom")
	}
	return nil
}

func TestRun(t *testing.T) {
	ctx := t.Context()
	seg := &sliceSegment{mem: make([]byte, Keys*4096)}
	sys := NewFarmem("farmem-test", seg, 0)
	res, err := Run(ctx, sys, Case{Op: Atomic, Size: 8, Depth: 4, Count: 400})
	require.NoError(t, err)
	require.EqualValues(t, 400, res.Ops)
	require.EqualValues(t, 400, res.Latency.Count())
	require.Positive(t, res.OpsPerSec())
	require.Equal(t, time.Duration(-1), res.ServerCPU)
	var sum uint64
	for k := range Keys {
		sum += binary.LittleEndian.Uint64(seg.mem[k*8:])
	}
	require.Greater(t, sum, uint64(400), "warm-up and timed adds both land")

	res, err = Run(ctx, sys, Case{Op: Read, Size: 4096, Depth: 2, Duration: 30 * time.Millisecond})
	require.NoError(t, err)
	require.Positive(t, res.Ops)
	require.Equal(t, byte(Keys-1), seg.mem[(Keys-1)*4096], "Prepare wrote each key's value")
	if _, err := SelfCPU(); err == nil {
		require.GreaterOrEqual(t, res.ClientCPU, time.Duration(0))
	}

	_, err = Run(ctx, sys, Case{Op: Read, Size: 8192, Depth: 1, Count: 1})
	require.ErrorIs(t, err, ErrInvalid, "the segment holds no %d values of 8 KiB", Keys)

	_, err = Run(ctx, &failing{n: 5}, Case{Op: Read, Size: 64, Depth: 3, Count: 100})
	require.ErrorContains(t, err, "boom")
}

// roundTrip checks that a system stores what it is given: a write of each
// key, then a read of each.
func roundTrip(t *testing.T, sys System, size int) {
	ctx := t.Context()
	require.NoError(t, sys.Prepare(ctx, Write, size))
	for k := range Keys {
		buf := bytes.Repeat([]byte{byte(k)}, size)
		require.NoError(t, sys.Do(ctx, Write, k, buf))
	}
	require.NoError(t, sys.Prepare(ctx, Write, size)) // Write's Prepare keeps values
	for k := range Keys {
		buf := make([]byte, size)
		require.NoError(t, sys.Do(ctx, Read, k, buf))
		require.Equal(t, bytes.Repeat([]byte{byte(k)}, size), buf, "key %d", k)
	}
}

func TestSystems(t *testing.T) {
	ctx := t.Context()
	for _, tc := range []struct {
		name   string
		open   func(t *testing.T) System
		atomic bool
		server bool // another local process serves it
	}{
		{"memory", func(*testing.T) System { return NewMemory() }, true, false},
		{"tcp-raw", func(t *testing.T) System {
			s, err := NewTCPRaw(64 << 10)
			require.NoError(t, err)
			return s
		}, false, false},
		{"grpc", func(t *testing.T) System {
			s, err := NewGRPC()
			require.NoError(t, err)
			return s
		}, false, false},
		{"memcached", func(t *testing.T) System {
			s, err := NewMemcached(ctx, benchtest.Memcached(t), 16)
			require.NoError(t, err)
			return s
		}, true, true},
		{"redis", func(t *testing.T) System {
			s, err := NewRedis(ctx, benchtest.Redis(t), 16)
			require.NoError(t, err)
			return s
		}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sys := tc.open(t)
			defer func() { require.NoError(t, sys.Close()) }()
			require.Equal(t, tc.name, sys.Name())
			if tc.name != "memory" {
				roundTrip(t, sys, 4096)
			}
			for _, c := range []Case{
				{Op: Read, Size: 64, Depth: 1},
				{Op: Write, Size: 65536, Depth: 16},
				{Op: Atomic, Size: 8, Depth: 16},
			} {
				c.Duration, c.Warmup = 40*time.Millisecond, 10*time.Millisecond
				res, err := Run(ctx, sys, c)
				if c.Op == Atomic && !tc.atomic {
					require.ErrorIs(t, err, ErrNotSupported)
					continue
				}
				require.NoError(t, err, "%s %d ×%d", c.Op, c.Size, c.Depth)
				require.Positive(t, res.Ops)
				require.Equal(t, tc.name, res.System)
			}
			if tc.server && os.Geteuid() == 0 {
				require.Positive(t, sys.ServerPID(), "root sees the server's process")
			} else if !tc.server {
				require.Zero(t, sys.ServerPID())
			}
		})
	}
}

func TestServerCPU(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("finding the process behind a port needs to read its /proc/PID/fd: run as root")
	}
	addr := benchtest.Redis(t)
	pid, err := ListenerPID(addr)
	require.NoError(t, err)
	sys, err := NewRedis(t.Context(), addr, 4)
	require.NoError(t, err)
	defer sys.Close()
	require.Equal(t, pid, sys.ServerPID())
	res, err := Run(t.Context(), sys, Case{Op: Write, Size: 4096, Depth: 4, Count: 2000})
	require.NoError(t, err)
	require.Positive(t, res.ServerCPU, "redis worked for 2000 SETs")
	row := NewRow(res)
	require.NotNil(t, row.ServerCPUNsPerOp)
	require.NotNil(t, row.ClientCPUNsPerOp)

	_, err = ListenerPID("127.0.0.1:1")
	require.ErrorIs(t, err, ErrUnknown)
	_, err = ListenerPID("no-port")
	require.ErrorIs(t, err, ErrInvalid)
}

func TestChildServers(t *testing.T) {
	for _, kind := range []string{"tcp-raw", "grpc"} {
		t.Run(kind, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), serveEnv+"="+kind)
			child, err := StartChild(cmd)
			require.NoError(t, err)
			defer func() { require.NoError(t, child.Close()) }()
			var sys System
			if kind == "grpc" {
				sys, err = DialGRPC(child.Addr, child.PID)
			} else {
				sys, err = DialTCPRaw(child.Addr, 64<<10, child.PID)
			}
			require.NoError(t, err)
			defer sys.Close()
			roundTrip(t, sys, 4096)
			res, err := Run(t.Context(), sys, Case{Op: Read, Size: 4096, Depth: 4, Count: 2000})
			require.NoError(t, err)
			require.Equal(t, child.PID, sys.ServerPID())
			if _, err := ProcessCPU(child.PID); err == nil {
				require.Positive(t, res.ServerCPU, "the server process worked for 2000 reads")
			}
		})
	}
	var out bytes.Buffer
	require.ErrorIs(t, Serve("smtp", 1, &out, func() {}), ErrInvalid)
	_, err := StartChild(exec.Command("true"))
	require.ErrorContains(t, err, "printed no address")
}

func TestResultAdd(t *testing.T) {
	a := &Result{Ops: 10, Elapsed: time.Second, ClientCPU: 5, ServerCPU: -1}
	a.Latency.Record(100)
	b := &Result{Ops: 30, Elapsed: time.Second, ClientCPU: 7, ServerCPU: 3}
	b.Latency.Record(300)
	b.Latency.Record(300)
	a.Add(b)
	require.EqualValues(t, 40, a.Ops)
	require.Equal(t, 20.0, a.OpsPerSec())
	require.EqualValues(t, 3, a.Latency.Count())
	require.Equal(t, time.Duration(12), a.ClientCPU)
	require.Equal(t, time.Duration(-1), a.ServerCPU, "unknown in one round is unknown")
}
