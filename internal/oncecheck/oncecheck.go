package oncecheck

import (
	"context"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/coherence/lincheck"
)

// Target is what the workload runs against. Word 0 is the shared counter;
// word g+1 belongs to goroutine g alone. Each method retries whatever its
// transport may safely retry and returns an error only when the outcome is
// final; Indeterminate tells the errors that leave it unknown. Run calls
// the methods from several goroutines at once.
type Target interface {
	// Add adds 1 to word 0 and returns its previous value.
	Add(ctx context.Context) (prev uint64, err error)
	// CAS swaps word w from old to new.
	CAS(ctx context.Context, w int, old, new uint64) (prev uint64, swapped bool, err error)
	// Load reads word w.
	Load(ctx context.Context, w int) (uint64, error)
	// Indeterminate reports whether err means the outcome is unknown.
	Indeterminate(err error) bool
}

// Result counts the outcomes of a Run. A plain value.
type Result struct {
	Adds, AddsIndeterminate               int
	Swapped, NotSwapped, CASIndeterminate int
}

// Run does ops adds, spread over goroutines, then ops CAS, each goroutine
// on its own word (every fourth with a wrong old value, so refusals are
// exercised too), and checks every answer; then a short run of reads and
// CAS on one shared word whose history must be linearizable. Words
// 0..goroutines+1 must start at zero.
func Run(t testing.TB, ctx context.Context, tg Target, ops, goroutines int) Result {
	var (
		mu    sync.Mutex
		res   Result
		prevs []uint64
		wg    sync.WaitGroup
	)
	for g := range goroutines {
		n := ops/goroutines + boolInt(g < ops%goroutines)
		wg.Go(func() {
			var mine []uint64
			indet := 0
			for range n {
				prev, err := tg.Add(ctx)
				if err != nil {
					if !assert.Truef(t, tg.Indeterminate(err), "Add failed: %v", err) {
						return
					}
					indet++
					continue
				}
				mine = append(mine, prev)
			}
			mu.Lock()
			prevs = append(prevs, mine...)
			res.AddsIndeterminate += indet
			mu.Unlock()
		})
	}
	wg.Wait()
	require.False(t, t.Failed(), "the add run failed")
	res.Adds = len(prevs)
	counter, err := tg.Load(ctx, 0)
	require.NoError(t, err)
	require.GreaterOrEqual(t, counter, uint64(res.Adds), "successful adds lost")
	require.LessOrEqual(t, counter, uint64(res.Adds+res.AddsIndeterminate), "an add was applied twice: %d successful, %d indeterminate", res.Adds, res.AddsIndeterminate)
	slices.Sort(prevs)
	for i, p := range prevs {
		require.Less(t, p, counter, "an add saw a value past the final counter")
		if i > 0 {
			require.NotEqual(t, prevs[i-1], p, "two successful adds saw the same previous value")
		}
	}

	for g := range goroutines {
		n := ops/goroutines + boolInt(g < ops%goroutines)
		w := g + 1
		wg.Go(func() {
			var r Result
			cur := uint64(0) // the word's value: this goroutine is its only writer
			for i := range n {
				old, new := cur, cur+1
				if i%4 == 3 {
					old = cur + 1<<40 // wrong on purpose: must not swap
				}
				prev, swapped, err := tg.CAS(ctx, w, old, new)
				switch {
				case err != nil:
					if !assert.Truef(t, tg.Indeterminate(err), "CAS failed: %v", err) {
						return
					}
					r.CASIndeterminate++
					v, err := tg.Load(ctx, w)
					if !assert.NoError(t, err) {
						return
					}
					can := []uint64{cur}
					if old == cur { // only a CAS with the right old value may have stored
						can = append(can, new)
					}
					if !assert.Contains(t, can, v, "after an indeterminate CAS (old %d, word %d) the word holds %d", old, cur, v) {
						return
					}
					cur = v
				case swapped:
					if !assert.Equal(t, old, cur, "CAS with a wrong old value swapped") {
						return
					}
					if !assert.Equal(t, cur, prev, "swapped CAS reports another previous value") {
						return
					}
					r.Swapped++
					cur = new
				default:
					// The word is cur unless this CAS (an earlier attempt of
					// it) stored new: then prev would be new.
					if !assert.Equal(t, cur, prev, "CAS reported not swapped, but the word held %d, not %d: its own first attempt stored it", prev, cur) {
						return
					}
					if !assert.NotEqual(t, old, cur, "CAS with the right old value did not swap") {
						return
					}
					r.NotSwapped++
				}
			}
			v, err := tg.Load(ctx, w)
			if !assert.NoError(t, err) {
				return
			}
			if !assert.Equal(t, cur, v, "word %d after the CAS run", w) {
				return
			}
			mu.Lock()
			res.Swapped += r.Swapped
			res.NotSwapped += r.NotSwapped
			res.CASIndeterminate += r.CASIndeterminate
			mu.Unlock()
		})
	}
	wg.Wait()
	require.False(t, t.Failed(), "the CAS run failed")
	// A run whose every operation was indeterminate checks nothing: most
	// must have had an answer, and both CAS outcomes must have occurred.
	require.Greater(t, res.Adds, res.AddsIndeterminate, "adds: %+v", res)
	require.Greater(t, res.Swapped+res.NotSwapped, res.CASIndeterminate, "CAS: %+v", res)
	require.Positive(t, res.Swapped, "CAS: %+v", res)
	require.Positive(t, res.NotSwapped, "CAS: %+v", res)
	linearizable(t, ctx, tg, min(ops/20, 2000), goroutines)
	return res
}

// linearizable has the goroutines read and increment one shared word,
// goroutines+1, with CAS (ops in all), records the history and checks it
// with porcupine: a CAS applied twice, or reported not swapped although it
// stored, leaves a history no order of the operations explains.
func linearizable(t testing.TB, ctx context.Context, tg Target, ops, goroutines int) {
	w := goroutines + 1
	rec := lincheck.NewRecorder()
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for range ops / goroutines / 2 {
				call := rec.Now()
				v, err := tg.Load(ctx, w)
				if !assert.NoError(t, err) {
					return
				}
				rec.Add(g, lincheck.Input{Kind: lincheck.Read, Key: w}, lincheck.Output{Value: v}, call)
				in := lincheck.Input{Kind: lincheck.CAS, Key: w, Old: v, New: v + 1}
				call = rec.Now()
				_, swapped, err := tg.CAS(ctx, w, v, v+1)
				if err != nil {
					if !assert.Truef(t, tg.Indeterminate(err), "CAS failed: %v", err) {
						return
					}
					rec.AddUnknown(g, in, call)
					continue
				}
				rec.Add(g, in, lincheck.Output{Swapped: swapped}, call)
			}
		})
	}
	wg.Wait()
	require.False(t, t.Failed(), "the shared CAS run failed")
	dir := os.Getenv("FARMEM_KEEP_HISTORIES") // as the other lincheck tests
	if dir == "" {
		dir = t.TempDir()
	}
	ok, path, err := lincheck.Check(rec.Ops(), 30*time.Second, dir)
	require.NoError(t, err)
	require.True(t, ok, "the shared CAS history is not linearizable (or the check timed out): %s", path)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
