package main

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/internal/session"
	"github.com/farmem/farmem/internal/size"
	"github.com/farmem/farmem/internal/testfs"
)

// TestMetadataFullFilesystem runs poold with its data directory on a
// 2 MiB tmpfs filled to the brim: an allocation fails with ErrNoCapacity
// naming the filesystem, /readyz says 503 naming the metadata store, every
// free commits, allocation resumes after frees and /readyz is 200 again
// with it, and after kill -9 and a restart the table holds exactly what was
// acknowledged. (TestStoreFullFilesystem covers the removal that needs the
// reserve.)
func TestMetadataFullFilesystem(t *testing.T) {
	data := testfs.SmallFS(t, 2*size.MiB)
	addr, sock := freeAddr(t, "tcp"), filepath.Join(shortDir(t), "p.sock")
	shm := pooltest.ShmDir(t)
	d := startDaemon(t, data, sock, "--metrics", addr, "--shm-dir", shm)
	// The socket accepts before the store is open: wait for readiness.
	require.Eventually(t, func() bool { code, _ := httpGet(addr, "/readyz"); return code == http.StatusOK }, 10*time.Second, 20*time.Millisecond)
	filler := testfs.FillFS(t, data, 96*size.KiB)

	conn, err := session.Channel("unix", sock)
	require.NoError(t, err)
	defer conn.Close()
	api := poolv1.NewPoolClient(conn)
	ctx := t.Context()
	alloc := func() (uint64, error) {
		seg, err := api.Alloc(ctx, &poolv1.AllocRequest{Size: 4096, Tier: poolv1.Tier_TIER_LOCAL, Persist: true})
		if err != nil {
			return 0, errs.FromStatus(err)
		}
		return seg.Id, nil
	}

	// Fill the rest with records, four clients at a time, until the
	// store refuses; every acknowledged id is kept.
	var (
		mu    sync.Mutex
		live  []uint64
		full  error
		g     errgroup.Group
		stop  = make(chan struct{})
		once  sync.Once
		other error
	)
	for range 4 {
		g.Go(func() error {
			for {
				select {
				case <-stop:
					return nil
				default:
				}
				id, err := alloc()
				mu.Lock()
				switch {
				case err == nil:
					live = append(live, id)
				case errors.Is(err, errs.ErrNoCapacity):
					full = err
					once.Do(func() { close(stop) })
				default:
					other = err
					once.Do(func() { close(stop) })
				}
				mu.Unlock()
			}
		})
	}
	require.NoError(t, g.Wait())
	require.NoError(t, other)
	require.Error(t, full)
	t.Logf("%d segments fill the store; then: %v", len(live), full)
	require.ErrorContains(t, full, data, "names the filesystem")
	require.ErrorContains(t, full, "--data-dir", "says what to do")
	require.Greater(t, len(live), 50)

	code, body := httpGet(addr, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	require.Contains(t, body, "metadata store")
	require.Contains(t, body, data)

	// Every free commits, the filesystem still full.
	slices.Sort(live)
	freed := live[:len(live)*2/3]
	live = live[len(freed):]
	for _, id := range freed {
		_, err := api.Free(ctx, &poolv1.FreeRequest{Id: id})
		require.NoError(t, errs.FromStatus(err), "free %d on a full filesystem", id)
	}
	// Allocation resumes on the pages the frees left, and readiness with it.
	for range 8 {
		id, err := alloc()
		require.NoError(t, err, "allocation after frees")
		live = append(live, id)
	}
	code, body = httpGet(addr, "/readyz")
	require.Equal(t, http.StatusOK, code, body)

	require.NoError(t, os.Remove(filler))
	id, err := alloc()
	require.NoError(t, err)
	live = append(live, id)

	d.kill9(t)
	startDaemon(t, data, sock, "--shm-dir", shm)
	resp, err := api.List(ctx, &poolv1.ListRequest{})
	require.NoError(t, err)
	var got []uint64
	for _, s := range resp.Segments {
		got = append(got, s.Id)
	}
	slices.Sort(live)
	require.Equal(t, live, got, "after kill -9: every acknowledged allocation, no acknowledged free")
}
