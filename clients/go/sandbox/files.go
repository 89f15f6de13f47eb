package sandbox

import (
	"bytes"
	"errors"
	"fmt"
	"io"
)

// uploadSource hands each attempt of an upload its body. A seekable source is rewound to where it
// started, so the upload can be retried; any other reader is sent once.
type uploadSource struct {
	r      io.Reader
	seeker io.Seeker
	start  int64
	limit  int64
	used   bool
}

func newUploadSource(r io.Reader, limit int64) (*uploadSource, error) {
	src := &uploadSource{r: r, limit: limit}
	if s, ok := r.(io.Seeker); ok {
		pos, err := s.Seek(0, io.SeekCurrent)
		if err != nil {
			return nil, fmt.Errorf("reading the upload position: %w", err)
		}
		src.seeker, src.start = s, pos
	}
	return src, nil
}

// attempts is def for a seekable source and 1 for a plain reader (its bytes cannot be sent twice).
func (u *uploadSource) attempts(def int) int {
	if u.seeker == nil {
		return 1
	}
	return def
}

// open returns the body for the next attempt, capped at the upload limit.
func (u *uploadSource) open() (io.Reader, error) {
	if u.used {
		if u.seeker == nil {
			return nil, errors.New("upload body cannot be replayed")
		}
		if _, err := u.seeker.Seek(u.start, io.SeekStart); err != nil {
			return nil, fmt.Errorf("rewinding the upload: %w", err)
		}
	}
	u.used = true
	return &cappedReader{r: u.r, left: u.limit, limit: u.limit}, nil
}

// cappedReader fails once more than the upload limit has been read (the request is then aborted, and not
// retried: httpCaller.do ends the call on an ErrInvalidArgument from the body).
type cappedReader struct {
	r     io.Reader
	left  int64
	limit int64
}

func (c *cappedReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.left -= int64(n)
	if c.left < 0 {
		return n, invalidf("upload exceeds MaxUploadSize (%d bytes)", c.limit)
	}
	return n, err
}

// copyLimited copies a download to w, failing with ErrResponseTooLarge past limit bytes.
func copyLimited(w io.Writer, body io.Reader, limit int64, what string) (int64, error) {
	n, err := io.Copy(w, io.LimitReader(body, limit))
	if err != nil {
		return n, fmt.Errorf("%s: reading response: %w", what, err)
	}
	var probe [1]byte
	if m, _ := body.Read(probe[:]); m > 0 {
		return n, fmt.Errorf("%s: %w (%d bytes)", what, ErrResponseTooLarge, limit)
	}
	return n, nil
}

func bytesSource(b []byte) *uploadSource {
	src, _ := newUploadSource(bytes.NewReader(b), int64(len(b))+1)
	return src
}
