package tcp

import (
	"errors"
	"io"
)

// frameReader is a small read buffer for fixed-size frame headers that hands
// payloads to their destination with as few copies as possible: readInto
// copies only the bytes that already arrived together with earlier headers
// and reads the rest straight from the socket into the destination.
// It is owned by one goroutine and not safe for concurrent use.
type frameReader struct {
	src  io.Reader
	buf  []byte
	r, w int

	// partial, if set, is called before the socket is read for the rest
	// of a frame that has begun to arrive: a header found incomplete, or a
	// payload. The server uses it to bound how long a frame may take.
	partial func()
}

// begun tells partial that the frame in progress is incomplete.
func (f *frameReader) begun() {
	if f.partial != nil {
		f.partial()
	}
}

func newFrameReader(src io.Reader, size int) *frameReader {
	return &frameReader{src: src, buf: make([]byte, size)}
}

// buffered returns the number of bytes read from the socket but not consumed.
func (f *frameReader) buffered() int { return f.w - f.r }

// next returns the next n bytes (n <= len(buf)), reading from the socket as
// needed. The slice is valid until the next call. A clean end of stream before
// the first byte gives io.EOF, in the middle io.ErrUnexpectedEOF.
func (f *frameReader) next(n int) ([]byte, error) { return f.nextLimit(n, len(f.buf)) }

// nextLimit is next, but reads at most limit bytes ahead of f.r from the
// socket. A small limit keeps a large payload that follows the header out
// of the buffer, so it can be read straight into its destination.
func (f *frameReader) nextLimit(n, limit int) ([]byte, error) {
	if f.w-f.r < n {
		if f.r == f.w {
			f.r, f.w = 0, 0
		} else if len(f.buf)-f.r < n {
			f.w = copy(f.buf, f.buf[f.r:f.w])
			f.r = 0
		}
		end := min(len(f.buf), f.r+max(limit, n))
		for f.w-f.r < n {
			if f.w > f.r {
				f.begun()
			}
			m, err := f.src.Read(f.buf[f.w:end])
			f.w += m
			if err != nil {
				if f.w-f.r >= n {
					break
				}
				if errors.Is(err, io.EOF) && f.w-f.r > 0 {
					err = io.ErrUnexpectedEOF
				}
				return nil, err
			}
		}
	}
	b := f.buf[f.r : f.r+n]
	f.r += n
	return b, nil
}

// take returns up to n already-buffered bytes and consumes them.
func (f *frameReader) take(n int) []byte {
	if b := f.w - f.r; b < n {
		n = b
	}
	p := f.buf[f.r : f.r+n]
	f.r += n
	return p
}

// readInto fills p: first from the buffer, then straight from the socket.
func (f *frameReader) readInto(p []byte) error {
	c := copy(p, f.take(len(p)))
	if c == len(p) {
		return nil
	}
	f.begun()
	_, err := io.ReadFull(f.src, p[c:])
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// discard consumes n bytes, reusing the buffer as scratch space.
func (f *frameReader) discard(n int) error {
	n -= len(f.take(n))
	if n > 0 {
		f.begun()
	}
	for n > 0 {
		f.r, f.w = 0, 0
		chunk := min(n, len(f.buf))
		if _, err := io.ReadFull(f.src, f.buf[:chunk]); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		n -= chunk
	}
	return nil
}
