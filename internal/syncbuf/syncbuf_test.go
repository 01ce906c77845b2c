package syncbuf

import (
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestConcurrentWritesAndReads(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				b.Write([]byte("x\n"))
				_ = b.String()
			}
		}()
	}
	wg.Wait()
	require.Equal(t, 800, b.Len())
	require.Equal(t, 400, strings.Count(b.String(), "x\n"))
}
