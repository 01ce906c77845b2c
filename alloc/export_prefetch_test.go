package alloc

// ReadAheadWindow is the window of s's read-ahead stream (0: no stream),
// and -1 when s does not read ahead.
func ReadAheadWindow(s *Segment) int64 {
	be := s.backend()
	if e, ok := be.(*emulated); ok {
		be = e.next
	}
	ra, ok := be.(*readahead)
	if !ok {
		return -1
	}
	ra.mu.Lock()
	defer ra.mu.Unlock()
	return ra.st.window
}
