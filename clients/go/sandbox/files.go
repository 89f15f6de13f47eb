package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
)

// uploadSource hands each attempt of an upload its body. A seekable source is rewound to where it
// started, so the upload can be retried; any other reader is sent once.
//
// The transport never reads the source itself: each attempt's body is a pipe that a goroutine (a feeder)
// fills from it, and the pipe is closed with the attempt context's error when that context ends. net/http's
// Client.Do does not return before a Read of its request body has, so a source whose Read blocked (a pipe
// nobody writes to, a stalled network stream) used to hold WriteFrom past its deadline and past a cancel -
// forever, for a Read that never returns. Now the call ends with its context, and the feeder, abandoned in
// that Read, ends when the Read returns (what it read is discarded).
type uploadSource struct {
	r      io.Reader
	seeker io.Seeker
	start  int64
	limit  int64
	used   bool
	feed   *feeder // the feeder of the latest attempt (nil before the first, and once stopped)
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

// body is a wireRequest's per-attempt body: encode writes the attempt's content (the source from where the
// upload started, capped at the upload limit) in the wire format, through a feeder. The caller ends the
// call with finish.
func (u *uploadSource) body(encode func(w io.Writer, content io.Reader) error) func(context.Context) (io.Reader, error) {
	return func(ctx context.Context) (io.Reader, error) {
		// a retry: the previous attempt's feeder is stopped first, so only one goroutine ever reads the source
		// and the rewind does not race a Read
		if err := u.stopFeeding(ctx); err != nil {
			return nil, err
		}
		content, err := u.open()
		if err != nil {
			return nil, err
		}
		u.feed = startFeeder(ctx, content, encode)
		return u.feed, nil
	}
}

// finish ends the upload's last feeder: when the call returns the source is no longer read - unless ctx (the
// call's context) ended, and a Read of the source that had not returned yet is abandoned to its feeder.
func (u *uploadSource) finish(ctx context.Context) {
	_ = u.stopFeeding(ctx)
}

// errUploadEnded is what the transport reads from an attempt's pipe once the SDK has stopped its feeder.
var errUploadEnded = errors.New("upload attempt ended")

// stopFeeding closes the latest feeder and waits until its goroutine has stopped reading the source, or ctx
// ends (then ctx's error, and the feeder is left to end when its Read of the source returns).
func (u *uploadSource) stopFeeding(ctx context.Context) error {
	f := u.feed
	if f == nil {
		return nil
	}
	f.unwatch()
	f.closeWith(errUploadEnded) // no effect on a feeder already closed (by its context, say)
	select {
	case <-f.done:
		u.feed = nil
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// feeder is one attempt's request body: a pipe that a goroutine fills (encode) from the content. Once it is
// closed - by the transport, by its context's end, or by stopFeeding - a read of it returns at once,
// whatever the goroutine is doing, and the goroutine reads the content no more (a Read already under way
// is abandoned to it: the goroutine ends when that Read returns).
type feeder struct {
	pr        *io.PipeReader
	done      chan struct{} // closed when the goroutine has returned
	closed    chan struct{} // closed by closeWith
	closeOnce sync.Once
	unwatch   func() bool // unregisters the close at the context's end
}

func startFeeder(ctx context.Context, content io.Reader, encode func(w io.Writer, content io.Reader) error) *feeder {
	pr, pw := io.Pipe()
	f := &feeder{pr: pr, done: make(chan struct{}), closed: make(chan struct{})}
	f.unwatch = context.AfterFunc(ctx, func() { f.closeWith(ctx.Err()) })
	go func() {
		defer close(f.done)
		pw.CloseWithError(encode(pw, &guardedReader{r: content, closed: f.closed})) // nil: the reader gets io.EOF
	}()
	return f
}

func (f *feeder) Read(p []byte) (int, error) { return f.pr.Read(p) }

// Close is the transport's, when it is done with the body.
func (f *feeder) Close() error {
	f.closeWith(errUploadEnded)
	return nil
}

func (f *feeder) closeWith(err error) {
	f.closeOnce.Do(func() {
		f.pr.CloseWithError(err)
		close(f.closed)
	})
}

// guardedReader reads r until closed is: a feeder's goroutine starts no Read of the source after the
// feeder was closed (io.Copy would, after a Read of no bytes and no error).
type guardedReader struct {
	r      io.Reader
	closed <-chan struct{}
}

func (g *guardedReader) Read(p []byte) (int, error) {
	select {
	case <-g.closed:
		return 0, errUploadEnded
	default:
	}
	return g.r.Read(p)
}

// open returns the content for the next attempt, capped at the upload limit.
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

// copyLimited copies a download to w, failing with ErrResponseTooLarge past limit bytes. A body cut off
// while the call's context lives is asked about (ep's Sandbox, once): ErrSandboxDeleted (or ErrNotReady,
// suspended) when it says why, else a *ConnectionError (ErrConnection) saying the download was cut. Until
// December 7 it was an untyped "reading response: unexpected EOF" that named no sandbox.
func copyLimited(ctx context.Context, ep *endpoint, w io.Writer, body io.Reader, limit int64, what string) (int64, error) {
	src := &bodyReader{r: body}
	n, err := io.Copy(w, io.LimitReader(src, limit))
	if err != nil {
		if src.err == nil || ctx.Err() != nil { // the writer's error, or the call's end (its own error says it)
			return n, fmt.Errorf("%s: reading response: %w", what, err)
		}
		cut := fmt.Errorf("%s: after %d bytes: %w", what, n,
			&ConnectionError{Method: http.MethodGet, RequestSent: true, Cut: true, Err: src.err})
		var diag diagnosis
		if gone := ep.whyUnreachable(ctx, &diag); gone != nil {
			return n, fmt.Errorf("%w; %w", cut, gone)
		}
		return n, diag.final(cut)
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

// bodyReader keeps the error of a response body's Read (io.Copy's error may be the writer's).
type bodyReader struct {
	r   io.Reader
	err error
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}
