package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/certs"
)

// The cluster tests re-execute the test binary inside a test host's network
// namespace as an application. These variables tell it what to do.
const (
	// roleEnv names the role (a key of clientRoles).
	roleEnv = "FARMEM_TEST_ROLE"
	// targetEnv is the alloc.Dial target: a unix socket path or tcp://IP:PORT.
	targetEnv = "FARMEM_TEST_TARGET"
	// sizeEnv is the segment size in bytes for the roles that allocate.
	sizeEnv = "FARMEM_TEST_SIZE"
	// gateEnv is a file whose appearance starts the counter role's work, so
	// that two counters run at the same time.
	gateEnv = "FARMEM_TEST_GATE"
	// tlsEnv is a directory made by certs.Init: a tcp:// target is dialed
	// with its client certificate "app".
	tlsEnv = "FARMEM_TEST_TLS_DIR"
)

// The shared segment of TestClusterJoinAndRemoteOps.
const (
	sharedName = "shared"
	sharedSize = 1 << 20
	// patternFrom is where the pattern starts; below it are the counters.
	patternFrom = 4096
	// counterAdds and counterCASes are each counter process's increments of
	// the word at 0 (Add64) and at 8 (a CompareAndSwap64 loop).
	counterAdds  = 500
	counterCASes = 200
)

// clientRoles are the applications a cluster test can run in a host. Each
// prints its progress as lines on stdout, which the test waits for.
var clientRoles = map[string]func(ctx context.Context) error{
	"alloc-shared": roleAllocShared,
	"counter":      roleCounter,
	"check":        roleCheck,
	"watch":        roleWatch,
	"hold":         roleHold,
}

// runRole runs the role named by roleEnv and returns the exit status.
func runRole(role string) int {
	fn, ok := clientRoles[role]
	if !ok {
		fmt.Printf("error: unknown %s %q\n", roleEnv, role)
		return 2
	}
	if err := fn(context.Background()); err != nil {
		fmt.Printf("error: %s: %v\n", role, err)
		return 1
	}
	return 0
}

// appIdentity is the identity of a client that dials a tcp:// target with
// the "app" certificate: a name created on the socket (as root) is granted
// to it, or its attach is refused.
const appIdentity = "cn:app"

func dialTarget(ctx context.Context, opts ...alloc.DialOption) (*alloc.Client, error) {
	if dir := os.Getenv(tlsEnv); dir != "" {
		tc, err := alloc.LoadTLS(certs.CertFile(dir, "app"), certs.KeyFile(dir, "app"), certs.CAFile(dir))
		if err != nil {
			return nil, err
		}
		opts = append(opts, alloc.WithTLS(tc))
	}
	return alloc.Dial(ctx, os.Getenv(targetEnv), opts...)
}

// pattern is the byte the shared segment holds at offset i ≥ patternFrom.
func pattern(i int) byte { return byte(i % 251) }

// roleAllocShared allocates the named rdma segment, zeroes the counters,
// writes the pattern, reads it back and prints "ready <node>".
func roleAllocShared(ctx context.Context) error {
	c, err := dialTarget(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	seg, err := c.Alloc(ctx, sharedSize, alloc.WithTier(alloc.TierRDMA), alloc.WithName(sharedName, alloc.AllowIdentity(appIdentity)))
	if err != nil {
		return err
	}
	want := make([]byte, sharedSize)
	for i := patternFrom; i < len(want); i++ {
		want[i] = pattern(i)
	}
	if _, err := seg.WriteAt(want, 0); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	got := make([]byte, sharedSize)
	if _, err := seg.ReadAt(got, 0); err != nil {
		return fmt.Errorf("read back: %w", err)
	}
	if !bytes.Equal(got, want) {
		return errors.New("read back other bytes than written")
	}
	fmt.Println("ready", seg.Node())
	return nil
}

// roleCounter attaches the shared segment, prints "attached", waits for the
// gate file, then increments the word at 0 with Add64 and the word at 8
// with CompareAndSwap64 loops, concurrently, and prints "done".
func roleCounter(ctx context.Context) error {
	c, err := dialTarget(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	seg, err := c.Attach(ctx, sharedName)
	if err != nil {
		return err
	}
	fmt.Println("attached", seg.Node())
	gate := os.Getenv(gateEnv)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(gate); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("gate file %s did not appear", gate)
		}
	}
	var wg sync.WaitGroup
	errc := make(chan error, 2)
	wg.Go(func() {
		for range counterAdds {
			if _, err := seg.Add64(0, 1); err != nil {
				errc <- fmt.Errorf("add64: %w", err)
				return
			}
		}
	})
	wg.Go(func() {
		for range counterCASes {
			for {
				v, err := seg.Load64(8)
				if err != nil {
					errc <- fmt.Errorf("load64: %w", err)
					return
				}
				ok, err := seg.CompareAndSwap64(8, v, v+1)
				if err != nil {
					errc <- fmt.Errorf("cas64: %w", err)
					return
				}
				if ok {
					break
				}
			}
		}
	})
	wg.Wait()
	close(errc)
	if err := errors.Join(<-errc, <-errc); err != nil {
		return err
	}
	fmt.Println("done")
	return nil
}

// roleCheck attaches the shared segment and prints
// "values <word 0> <word 8> pattern <ok|bad>".
func roleCheck(ctx context.Context) error {
	c, err := dialTarget(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	seg, err := c.Attach(ctx, sharedName)
	if err != nil {
		return err
	}
	adds, err := seg.Load64(0)
	if err != nil {
		return err
	}
	cases, err := seg.Load64(8)
	if err != nil {
		return err
	}
	got := make([]byte, sharedSize-patternFrom)
	if _, err := seg.ReadAt(got, patternFrom); err != nil {
		return err
	}
	verdict := "ok"
	for i, b := range got {
		if b != pattern(patternFrom+i) {
			verdict = "bad"
			break
		}
	}
	fmt.Println("values", adds, cases, "pattern", verdict)
	return nil
}

// roleWatch allocates an unnamed rdma segment, fills it with random bytes,
// prints "ready <node>", then reads the whole segment every 50 ms and
// prints one line per read: "ok" (the bytes match), "mismatch", "lost"
// (ErrSegmentLost) or "err <error>". It runs until killed.
func roleWatch(ctx context.Context) error {
	c, err := dialTarget(ctx, alloc.WithOpTimeout(30*time.Second))
	if err != nil {
		return err
	}
	defer c.Close()
	seg, err := c.Alloc(ctx, sharedSize, alloc.WithTier(alloc.TierRDMA))
	if err != nil {
		return err
	}
	want := make([]byte, sharedSize)
	rand.Read(want)
	if _, err := seg.WriteAt(want, 0); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	fmt.Println("ready", seg.Node())
	got := make([]byte, sharedSize)
	for {
		clear(got)
		_, err := seg.ReadAt(got, 0)
		switch {
		case err == nil && bytes.Equal(got, want):
			fmt.Println("ok")
		case err == nil:
			fmt.Println("mismatch")
		case errors.Is(err, alloc.ErrSegmentLost):
			fmt.Println("lost")
		default:
			fmt.Println("err", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// roleHold allocates an unnamed rdma segment of sizeEnv bytes, prints
// "ready <node>" and waits to be killed.
func roleHold(ctx context.Context) error {
	size, err := strconv.ParseInt(os.Getenv(sizeEnv), 10, 64)
	if err != nil {
		return fmt.Errorf("%s: %w", sizeEnv, err)
	}
	c, err := dialTarget(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	seg, err := c.Alloc(ctx, size, alloc.WithTier(alloc.TierRDMA))
	if err != nil {
		return err
	}
	fmt.Println("ready", seg.Node())
	select {}
}
