package pool

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
)

// TestClientsAt: what a home is told of who may use the segments placed
// there follows the records as they are: the owner and the attachers of
// each copy on that node (a redundant segment's not lost), sorted; the
// source of a move to that node while the move may write its copy; the
// copy of a move under way to that node before its switch-over (not of
// one being undone); no administrator (no client id) nor peer; at most
// maxGrants, the last to attach left out; nothing of segments elsewhere.
func TestClientsAt(t *testing.T) {
	many := make([]string, maxGrants+2)
	for i := range many {
		many[i] = fmt.Sprintf("c%03d", i)
	}
	p := &core{segs: map[uint64]*record{
		1: {ID: 1, Home: "b", HomeID: 11, Owner: "own", Attached: []string{"x", "a"}},
		2: {ID: 2, Home: "c", HomeID: 12, Owner: "own"},
		3: {ID: 3, Home: "b", HomeID: 13, Owner: "", Attached: []string{"poold/c", "y"}},
		4: {ID: 4, Owner: "own", Homes: []homeRef{
			{Node: "b", HomeID: 14}, {Node: "c", HomeID: 15}, {Node: "b", HomeID: 16, State: poolv1.HomeState_HOME_STATE_LOST},
		}, Attached: []string{"z"}},
		5: {ID: 5, Home: "b", HomeID: 17, Owner: "own", Attached: many},
		6: {ID: 6, Home: "b", HomeID: 18, Owner: "own"},
		7: {ID: 7, Owner: "own"}, // homed here
		8: {ID: 8, Home: "c", HomeID: 20, Owner: "own"},
	}}
	p.moving.set(intent{ID: 6, From: "c", To: "b", ToID: 18, Switched: true})
	p.moving.set(intent{ID: 2, From: "c", To: "b", ToID: 19}) // before the switch-over: the record names c
	p.moving.set(intent{ID: 8, From: "c", To: "b", ToID: 21, undoing: true})
	got := p.clientsAt("b", 0)
	require.Equal(t, map[uint64][]string{
		11: {"a", "own", "x"},
		13: {"y"},
		14: {"own", "z"},
		17: append(many[:maxGrants-1:maxGrants-1], "own"),
		18: {"move-from-c", "own"},
		19: {"move-from-c", "own"}, // the copy of a move under way: clients attach and detach meanwhile
	}, got, "not the copy of a move being undone")
	require.Equal(t, map[uint64][]string{11: {"a", "own", "x"}}, p.clientsAt("b", 1))
	require.Equal(t, map[uint64][]string{19: {"move-from-c", "own"}}, p.clientsAt("b", 2))
	require.Empty(t, p.clientsAt("b", 8))
	require.Empty(t, p.clientsAt("b", 99), "freed")
	require.Equal(t, []string{"b", "c"}, p.segs[4].homeNodes())
	require.Nil(t, p.segs[7].homeNodes())
}
