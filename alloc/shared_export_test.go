package alloc

import "context"

// AbandonShared drops a shared attachment as a crashed process would: no
// write-back, no release (tests of sharer death).
func AbandonShared(s *SharedSegment) { s.abandon() }

// SessionID is the id of c's session with its daemon now, or "" while it
// has none.
func SessionID(c *Client) string {
	_, sid, err := c.callCtx(context.Background())
	if err != nil {
		return ""
	}
	return sid
}
