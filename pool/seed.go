package pool

import (
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
)

// SeedSegments writes n persistent segments of 4 KiB into the metadata
// store in dataDir, in one transaction, for tests and benchmarks of a large
// segment table (listing, restart) that would spend minutes allocating them
// one by one. The segments are homed on a peer named home that need not
// exist: they take no memory on this host, and a daemon without a cluster
// lists them as active. No daemon may be using dataDir meanwhile. It
// returns the ids it wrote, which continue after the store's.
func SeedSegments(dataDir string, n int, home string) ([]uint64, error) {
	st, err := openStore(dataDir, false)
	if err != nil {
		return nil, err
	}
	defer st.close()
	_, next, _, err := st.load()
	if err != nil {
		return nil, err
	}
	ids := make([]uint64, n)
	created := time.Now().UTC()
	err = st.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSegments)
		for i := range ids {
			r := &record{
				ID: next + uint64(i), Tier: poolv1.Tier_TIER_RDMA, Device: "peer", Extent: 4096, Size: 4096, Persist: true, Epoch: 1,
				Created: created, Home: home, HomeID: uint64(i + 1), DataAddr: "127.0.0.1:1",
			}
			v, err := encodeRecord(r)
			if err != nil {
				return err
			}
			if err := b.Put(idKey(r.ID), v); err != nil {
				return err
			}
			ids[i] = r.ID
		}
		return tx.Bucket(bucketMeta).Put(keyNextID, idKey(next+uint64(n)))
	})
	if err != nil {
		return nil, fmt.Errorf("seed %d segments in %s: %w", n, dataDir, err)
	}
	return ids, nil
}
