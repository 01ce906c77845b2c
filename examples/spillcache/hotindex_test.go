package main

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestHotIndex checks the index against a map through random puts and
// deletes, with hashes chosen to collide in their home buckets and tags
// (so runs wrap around the table, shift back on delete, and keys are told
// apart by comparing them), and across growth.
func TestHotIndex(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var x hotIndex
	x.init(4)
	var entries []hotEntry
	var holes []int32
	model := map[string]int32{}
	hashOf := func(k int) uint64 {
		// Few homes and few tags: many keys share both.
		return uint64(k%7)<<32 | uint64(k%13)
	}
	for step := range 20000 {
		k := rng.IntN(300)
		key := fmt.Sprint("key-", k)
		h := hashOf(k)
		i, ok := x.get(entries, h, key)
		mi, mok := model[key]
		require.Equal(t, mok, ok, "step %d: key %s present", step, key)
		if ok {
			require.Equal(t, mi, i, "step %d: key %s's entry", step, key)
			if rng.IntN(2) == 0 {
				x.del(entries, h, i)
				entries[i] = hotEntry{}
				holes = append(holes, i)
				delete(model, key)
			}
			continue
		}
		e := hotEntry{key: key, hash: h}
		if n := len(holes); n > 0 {
			i = holes[n-1]
			holes = holes[:n-1]
			entries[i] = e
		} else {
			i = int32(len(entries))
			entries = append(entries, e)
		}
		x.put(entries, h, i)
		model[key] = i
		require.Equal(t, len(model), x.n)
	}
	for key, i := range model {
		var k int
		_, err := fmt.Sscanf(key, "key-%d", &k)
		require.NoError(t, err)
		got, ok := x.get(entries, hashOf(k), key)
		require.True(t, ok, key)
		require.Equal(t, i, got, key)
	}
	// A far record's hash keeps only the low 62 bits: it finds the key.
	x.init(4)
	full := uint64(0xC000_1234_0000_0005)
	entries = []hotEntry{{key: "k", hash: full}}
	x.put(entries, full, 0)
	i, ok := x.get(entries, full&hashMask, "k")
	require.True(t, ok)
	require.Zero(t, i)
}

// TestHotIndexPrefetchDuringGrowth: prefetch, which a Get calls before it
// takes the shard's lock, reads the published table while puts under the
// lock grow it (the race detector checks that they share no memory).
func TestHotIndexPrefetchDuringGrowth(t *testing.T) {
	var x hotIndex
	x.init(4)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for h := uint64(0); ; h++ {
			select {
			case <-stop:
				return
			default:
				x.prefetch(h)
			}
		}
	}()
	var entries []hotEntry
	for i := range 5000 {
		h := uint64(i) * 0x9E3779B97F4A7C15
		entries = append(entries, hotEntry{key: fmt.Sprint(i), hash: h})
		x.put(entries, h, int32(i))
	}
	close(stop)
	<-done
	for i := range 5000 {
		got, ok := x.get(entries, entries[i].hash, entries[i].key)
		require.True(t, ok)
		require.Equal(t, int32(i), got)
	}
}
