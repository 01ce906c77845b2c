package pool

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAttachSyncDue: what a moved segment's target is still to be told
// follows the record as it is at each try: a client detached during the
// move loses its access, one attached gets it, one that attached again
// keeps it, one the target answered for is not asked again, and nothing
// is left once the record names the copy no more (freed, moved on).
func TestAttachSyncDue(t *testing.T) {
	at := func(node string, id uint64, attached ...string) *record {
		return &record{ID: 7, Home: node, HomeID: id, Attached: attached}
	}
	for _, tc := range []struct {
		name            string
		told            map[string]bool // what the target answered last (nil: as the move began)
		r               *record
		allow, withdraw []string
		done            bool
	}{
		{name: "detached during the move", r: at("b", 42, "new"), allow: []string{"new"}, withdraw: []string{"gone"}},
		{name: "attached again", told: map[string]bool{}, r: at("b", 42, "gone", "new"), allow: []string{"gone", "new"}},
		{name: "withdrawn and still detached", told: map[string]bool{"gone": false, "new": true}, r: at("b", 42, "new")},
		{name: "withdrawn, then attached again", told: map[string]bool{"gone": false, "new": true}, r: at("b", 42, "gone", "new"), allow: []string{"gone"}},
		{name: "given, then detached", told: map[string]bool{"gone": false, "new": true}, r: at("b", 42), withdraw: []string{"new"}},
		{name: "freed", r: nil, done: true},
		{name: "moved on", r: at("c", 9, "new"), done: true},
		{name: "another copy on the target", r: at("b", 43, "new"), done: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newAttachSync(7, "b", 42, []string{"gone", "kept"}, []string{"kept", "new"})
			require.Equal(t, []string{"gone", "kept", "new"}, s.clients)
			if tc.told != nil {
				s.told = tc.told
				s.told["kept"] = true
			}
			if tc.r != nil {
				tc.r.Attached = append(tc.r.Attached, "kept")
			}
			allow, withdraw, done := s.due(tc.r)
			require.Equal(t, tc.done, done)
			require.Equal(t, tc.allow, allow)
			require.Equal(t, tc.withdraw, withdraw)
		})
	}
}
