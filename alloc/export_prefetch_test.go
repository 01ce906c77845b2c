package alloc

// ReadAheadWindow is the window of s's read-ahead stream (0: no stream),
// and -1 when s does not read ahead.
func ReadAheadWindow(s *Segment) int64 {
	ra := readAheadOf(s)
	if ra == nil {
		return -1
	}
	ra.mu.Lock()
	defer ra.mu.Unlock()
	return ra.st.window
}

// readAheadOf is s's read-ahead backend, nil when s does not read ahead.
func readAheadOf(s *Segment) *readahead {
	be := s.backend()
	if e, ok := be.(*emulated); ok {
		be = e.next
	}
	ra, _ := be.(*readahead)
	return ra
}

// HoldPiece has s hold b as the piece at off, as a background read on its
// way that fetched b; the read completes when complete is called. False
// when s does not read ahead.
func HoldPiece(s *Segment, off int64, b []byte) (complete func(), ok bool) {
	ra := readAheadOf(s)
	if ra == nil {
		return nil, false
	}
	fl := &flight{done: make(chan struct{})}
	ra.mu.Lock()
	defer ra.mu.Unlock()
	ra.fills = append(ra.fills, &fill{off: off, buf: b, fl: fl})
	ra.nfills.Add(1)
	ra.held += int64(len(b))
	return func() { close(fl.done) }, true
}
