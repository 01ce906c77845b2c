package cluster

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/farmem/farmem/internal/errs"
	"github.com/stretchr/testify/require"
)

// peer is a member offering one tier.
func peer(name string, tier string, capacity, free int64) Member {
	return Member{Name: name, State: StateAlive, Boot: 1, Meta: Meta{Proto: 1,
		Tiers: []TierFree{{Name: tier, Capacity: capacity, Free: free}}}}
}

func with(m Member, edit func(*Member)) Member {
	edit(&m)
	return m
}

func TestPickTable(t *testing.T) {
	const G = int64(1) << 30
	self := peer("self", "rdma", 100*G, 100*G)
	for _, tc := range []struct {
		name    string
		members []Member
		tier    string
		size    int64
		want    []string // acceptable picks; empty means an error
		reason  NoPeerReason
	}{
		{"nobody", nil, "rdma", G, nil, NoAlivePeer},
		{"only self", []Member{self}, "rdma", G, nil, NoAlivePeer},
		{"dead and left peers", []Member{self,
			with(peer("a", "rdma", 10*G, 10*G), func(m *Member) { m.State = StateDead }),
			with(peer("b", "rdma", 10*G, 10*G), func(m *Member) { m.State = StateLeft }),
			with(peer("c", "rdma", 10*G, 10*G), func(m *Member) { m.State = StateSuspect }),
		}, "rdma", G, nil, NoAlivePeer},
		{"unreadable meta", []Member{with(peer("a", "rdma", 10*G, 10*G), func(m *Member) { m.MetaErr = ErrBadMeta })},
			"rdma", G, nil, NoAlivePeer},
		{"all draining or leaving", []Member{self,
			with(peer("a", "rdma", 10*G, 10*G), func(m *Member) { m.Meta.Draining = true }),
			with(peer("b", "rdma", 10*G, 10*G), func(m *Member) { m.Leaving = true }),
		}, "rdma", G, nil, AllDraining},
		{"nobody offers the tier", []Member{peer("a", "cxl", 10*G, 10*G)}, "rdma", G, nil, NoPeerWithTier},
		{"not enough free", []Member{peer("a", "rdma", 10*G, G-1), peer("b", "rdma", 10*G, G/2)}, "rdma", G, nil, NotEnoughFree},
		{"negative size", []Member{peer("a", "rdma", 10*G, 10*G)}, "rdma", -1, nil, InvalidRequest},
		{"empty tier", []Member{peer("a", "rdma", 10*G, 10*G)}, "", 1, nil, InvalidRequest},
		{"one fits", []Member{self, peer("a", "rdma", 10*G, G-1), peer("b", "rdma", 10*G, G)}, "rdma", G, []string{"b"}, 0},
		{"exact fit", []Member{peer("a", "rdma", G, G)}, "rdma", G, []string{"a"}, 0},
		{"zero size fits a full peer", []Member{peer("a", "rdma", G, 0)}, "rdma", 0, []string{"a"}, 0},
		{"two fit: more free wins", []Member{peer("a", "rdma", 10*G, 2*G), peer("b", "rdma", 10*G, 5*G)}, "rdma", G, []string{"b"}, 0},
		{"two fit: the larger free fraction wins, not the more free bytes", []Member{peer("a", "rdma", 100*G, 30*G), peer("b", "rdma", 10*G, 5*G)}, "rdma", G, []string{"b"}, 0},
		{"two fit: equal fractions, either", []Member{peer("a", "rdma", 100*G, 50*G), peer("b", "rdma", 10*G, 5*G)}, "rdma", G, []string{"a", "b"}, 0},
		{"exabyte tiers compare exactly", []Member{peer("a", "rdma", 1<<62, 1<<61), peer("b", "rdma", 1<<62-2, 1<<61-2)}, "rdma", G, []string{"a"}, 0},
		{"exclude honoured", []Member{self, peer("a", "rdma", 10*G, 2*G)}, "rdma", G, []string{"a"}, 0},
		{"other tiers ignored", []Member{
			{Name: "a", State: StateAlive, Meta: Meta{Tiers: []TierFree{{"cxl", 100 * G, 100 * G}, {"rdma", 10 * G, 3 * G}}}},
			{Name: "b", State: StateAlive, Meta: Meta{Tiers: []TierFree{{"cxl", 100 * G, 0}, {"rdma", 10 * G, 4 * G}}}},
		}, "rdma", G, []string{"b"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for seed := range uint64(20) {
				got, err := Pick(tc.members, tc.tier, tc.size, "self", rand.New(rand.NewPCG(seed, 1)))
				if len(tc.want) == 0 {
					var npe *NoPeerError
					require.ErrorAs(t, err, &npe)
					require.Equal(t, tc.reason, npe.Reason, "error: %v", err)
					require.ErrorIs(t, err, ErrNoPeer)
					require.ErrorIs(t, err, errs.ErrNoCapacity)
					require.Contains(t, err.Error(), tc.reason.String())
					require.Empty(t, got.Name)
					continue
				}
				require.NoError(t, err)
				require.Contains(t, tc.want, got.Name)
			}
		})
	}
}

func TestPickErrorSaysWhatToDo(t *testing.T) {
	_, err := Pick([]Member{peer("a", "rdma", 100, 10), peer("b", "rdma", 100, 40)}, "rdma", 64, "", nil)
	require.EqualError(t, err, `cluster: no peer for 64 bytes on tier "rdma": no peer has enough free bytes (2 peers offer it, most free 40 bytes on b); free segments or ask for less`)
	require.True(t, errors.Is(err, ErrNoPeer))
	// The daemon wraps ErrNoPeer itself when it has no peers to ask; that
	// is capacity too.
	require.ErrorIs(t, fmt.Errorf("%w: this daemon gossips with nobody", ErrNoPeer), errs.ErrNoCapacity)
}

func TestPickSpreadsEvenly(t *testing.T) {
	const nodes, picks = 10, 1000
	var ms []Member
	for i := range nodes {
		ms = append(ms, peer(fmt.Sprintf("p%d", i), "rdma", 1<<30, 1<<29))
	}
	ms = append(ms,
		with(peer("dead", "rdma", 1<<40, 1<<40), func(m *Member) { m.State = StateDead }),
		with(peer("draining", "rdma", 1<<40, 1<<40), func(m *Member) { m.Meta.Draining = true }),
		with(peer("leaving", "rdma", 1<<40, 1<<40), func(m *Member) { m.Leaving = true }),
		peer("small", "rdma", 1<<40, 1<<10),
		peer("me", "rdma", 1<<40, 1<<40),
	)
	rnd := rand.New(rand.NewPCG(1, 2))
	count := map[string]int{}
	for range picks {
		m, err := Pick(ms, "rdma", 1<<20, "me", rnd)
		require.NoError(t, err)
		count[m.Name]++
	}
	require.Len(t, count, nodes, "only the ten usable peers are ever picked: %v", count)
	// Each gets Binomial(1000, 0.1): mean 100, sd 9.5; [60,140] is over 4 sd.
	for name, n := range count {
		require.InDelta(t, picks/nodes, n, 40, "%s got %d of %d picks: %v", name, n, picks, count)
	}
}

func TestPickPrefersFreeAndNeverTheLeastFree(t *testing.T) {
	// Free bytes 1..8: with two distinct candidates the least free one can
	// never win, and the most free one wins every draw it takes part in.
	var ms []Member
	for i := 1; i <= 8; i++ {
		ms = append(ms, peer(fmt.Sprintf("p%d", i), "rdma", 100, int64(i)))
	}
	rnd := rand.New(rand.NewPCG(3, 4))
	count := map[string]int{}
	for range 4000 {
		m, err := Pick(ms, "rdma", 1, "", rnd)
		require.NoError(t, err)
		count[m.Name]++
	}
	require.Zero(t, count["p1"])
	// P(p8 is one of two distinct draws) = 1 - 7/8*6/7 = 1/4: about 1000.
	require.InDelta(t, 1000, count["p8"], 150)
	for i := 2; i < 8; i++ {
		require.Less(t, count[fmt.Sprintf("p%d", i)], count[fmt.Sprintf("p%d", i+1)], "more free, more picks: %v", count)
	}
}

func TestFreerThan(t *testing.T) {
	for _, tc := range []struct {
		a, b TierFree
		want bool
	}{
		{TierFree{Capacity: 10, Free: 6}, TierFree{Capacity: 100, Free: 50}, true},
		{TierFree{Capacity: 100, Free: 50}, TierFree{Capacity: 10, Free: 6}, false},
		{TierFree{Capacity: 10, Free: 5}, TierFree{Capacity: 100, Free: 50}, false}, // a tie is not freer
		{TierFree{Capacity: 0, Free: 0}, TierFree{Capacity: 10, Free: 1}, false},
		{TierFree{Capacity: 10, Free: 1}, TierFree{Capacity: 0, Free: 0}, true},
		{TierFree{Capacity: 10, Free: 0}, TierFree{Capacity: 0, Free: 0}, false},
		{TierFree{Capacity: 1<<63 - 1, Free: 1<<63 - 2}, TierFree{Capacity: 1<<63 - 2, Free: 1<<63 - 3}, true},
	} {
		require.Equal(t, tc.want, freerThan(tc.a, tc.b), "%+v vs %+v", tc.a, tc.b)
	}
}

// TestPickBalancesUnequalHosts places many equal segments on hosts of
// three sizes, applying each placement to the chosen host's free bytes as
// gossip would. Used fractions end within a few percent of the mean; with
// the same two random choices decided by free bytes (Pick's rule before)
// the largest hosts end far fuller than the smallest.
func TestPickBalancesUnequalHosts(t *testing.T) {
	const hosts, seg = 60, int64(256 << 10)
	sizes := []int64{24 << 20, 32 << 20, 48 << 20}
	run := func(pick func(ms []Member, rnd *rand.Rand) string) (maxOverMean float64) {
		var ms []Member
		var total int64
		for i := range hosts {
			c := sizes[i%len(sizes)]
			ms = append(ms, peer(fmt.Sprintf("p%d", i), "rdma", c, c))
			total += c
		}
		rnd := rand.New(rand.NewPCG(5, 6))
		for range total / seg / 2 { // fill to half
			name := pick(ms, rnd)
			i := slices.IndexFunc(ms, func(x Member) bool { return x.Name == name })
			ms[i].Meta.Tiers[0].Free -= seg
		}
		var sum, most float64
		for _, m := range ms {
			f := 1 - float64(m.Meta.Tiers[0].Free)/float64(m.Meta.Tiers[0].Capacity)
			sum += f
			most = max(most, f)
		}
		return most / (sum / hosts)
	}
	byFraction := run(func(ms []Member, rnd *rand.Rand) string {
		m, err := Pick(ms, "rdma", seg, "", rnd)
		require.NoError(t, err)
		return m.Name
	})
	byBytes := run(func(ms []Member, rnd *rand.Rand) string {
		a, b := ms[rnd.IntN(len(ms))], ms[rnd.IntN(len(ms))]
		if b.Meta.Tiers[0].Free > a.Meta.Tiers[0].Free {
			return b.Name
		}
		return a.Name
	})
	t.Logf("max/mean used fraction: %.3f by free fraction, %.3f by free bytes", byFraction, byBytes)
	require.Less(t, byFraction, 1.06, "Pick: max/mean used fraction")
	require.Greater(t, byBytes, 1.3, "the free-bytes rule this replaced: max/mean used fraction")
}

func TestPickDoesNotModifyAndReturnsCopies(t *testing.T) {
	ms := []Member{peer("a", "rdma", 10, 5), peer("b", "rdma", 10, 6)}
	got, err := Pick(ms, "rdma", 1, "", nil)
	require.NoError(t, err)
	got.Meta.Tiers[0].Free = 0
	require.Equal(t, int64(5), ms[0].Meta.Tiers[0].Free)
	require.Equal(t, int64(6), ms[1].Meta.Tiers[0].Free)
}

func BenchmarkPick(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		var ms []Member
		for i := range n {
			ms = append(ms, Member{Name: fmt.Sprintf("p%d", i), State: StateAlive, Meta: testMeta("p")})
		}
		b.Run(fmt.Sprintf("members=%d", n), func(b *testing.B) {
			rnd := rand.New(rand.NewPCG(1, 1))
			for b.Loop() {
				if _, err := Pick(ms, "rdma", 1<<20, "p0", rnd); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestPickNear checks how PickNear weighs measured latency against free
// capacity: with two candidates both are always drawn, so each case's
// verdict is the rule's, not the dice's.
func TestPickNear(t *testing.T) {
	const G = int64(1) << 30
	lat := map[string]time.Duration{"near": 100 * time.Microsecond, "far": time.Millisecond, "close": 110 * time.Microsecond}
	near := func(name string) (time.Duration, bool) { d, ok := lat[name]; return d, ok }
	count := func(members []Member, n Near) map[string]int {
		rnd := rand.New(rand.NewPCG(1, 2))
		got := map[string]int{}
		for range 400 {
			m, err := PickNear(members, "rdma", G, "self", rnd, n)
			require.NoError(t, err)
			got[m.Name]++
		}
		return got
	}
	for _, tc := range []struct {
		name    string
		members []Member
		near    Near
		want    func(t *testing.T, got map[string]int)
	}{
		{"equal free: the nearer always", []Member{peer("far", "rdma", 10*G, 5*G), peer("near", "rdma", 10*G, 5*G)}, near,
			func(t *testing.T, got map[string]int) { require.Equal(t, 400, got["near"], "%v", got) }},
		{"nearer and a little fuller: still the nearer", []Member{peer("far", "rdma", 10*G, 6*G), peer("near", "rdma", 10*G, 5*G)}, near,
			func(t *testing.T, got map[string]int) { require.Equal(t, 400, got["near"], "%v", got) }},
		{"nearer but much fuller: capacity first", []Member{peer("far", "rdma", 10*G, 8*G), peer("near", "rdma", 10*G, 5*G)}, near,
			func(t *testing.T, got map[string]int) { require.Equal(t, 400, got["far"], "%v", got) }},
		{"within a quarter: capacity decides", []Member{peer("close", "rdma", 10*G, 6*G), peer("near", "rdma", 10*G, 5*G)}, near,
			func(t *testing.T, got map[string]int) { require.Equal(t, 400, got["close"], "%v", got) }},
		{"unmeasured is not passed over", []Member{peer("new", "rdma", 10*G, 5*G), peer("near", "rdma", 10*G, 5*G)}, near,
			func(t *testing.T, got map[string]int) {
				require.Greater(t, got["new"], 100, "%v", got)
				require.Greater(t, got["near"], 100, "%v", got)
			}},
		{"unmeasured and emptier wins", []Member{peer("new", "rdma", 10*G, 6*G), peer("near", "rdma", 10*G, 5*G)}, near,
			func(t *testing.T, got map[string]int) { require.Equal(t, 400, got["new"], "%v", got) }},
		{"nil near is Pick", []Member{peer("far", "rdma", 10*G, 6*G), peer("near", "rdma", 10*G, 5*G)}, nil,
			func(t *testing.T, got map[string]int) { require.Equal(t, 400, got["far"], "%v", got) }},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.want(t, count(tc.members, tc.near)) })
	}
}
