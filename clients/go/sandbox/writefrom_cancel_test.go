package sandbox

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"
)

// blockingReader gives three 1 KiB chunks, then blocks in Read until release is closed (a pipe nobody
// writes to, a stalled network stream). Its count is not synchronised on purpose: the race detector then
// checks that only one goroutine at a time reads an upload's source.
type blockingReader struct {
	chunks  int
	release chan struct{}
}

func (b *blockingReader) Read(p []byte) (int, error) {
	if b.chunks < 3 {
		b.chunks++
		return copy(p, bytes.Repeat([]byte("x"), 1024)), nil
	}
	<-b.release
	return 0, io.EOF
}

// blockingSeeker is a blockingReader that claims to rewind (so WriteFrom retries it).
type blockingSeeker struct{ *blockingReader }

func (b blockingSeeker) Seek(int64, int) (int64, error) { return 0, nil }

// WriteFrom ends when its context does, even while a Read of the caller's reader blocks: at the deadline
// with ErrTimeout (and context.DeadlineExceeded), at a cancel with context.Canceled. It used to hang until
// the reader returned (forever for a reader that never does): the legacy runtime waited for the goroutine
// stuck in that Read, and on sandboxd net/http's Client.Do waited for its write loop, stuck in the same Read.
// "retry": a seekable reader whose first attempt got a 503 - the retry used to wait for (legacy) or race
// (sandboxd) the first attempt's Read.
func TestWriteFromEndsWithItsContextWhileTheReaderBlocks(t *testing.T) {
	for _, rt := range []Runtime{RuntimeLegacyPython, RuntimeSandboxd} {
		for _, end := range []string{"deadline", "cancel", "retry"} {
			t.Run(string(rt)+"/"+end, func(t *testing.T) {
				var mu sync.Mutex
				requests := 0
				srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
					mu.Lock()
					requests++
					n := requests
					mu.Unlock()
					if end == "retry" && n == 1 {
						// at once, before the body arrived whole (net/http's server would first wait for
						// the rest of it), and the connection closed: the client retries
						conn, rw, err := w.(http.Hijacker).Hijack()
						if err == nil {
							_, _ = rw.WriteString("HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n" +
								"Connection: close\r\n\r\n")
							_ = rw.Flush()
							_ = conn.Close()
						}
						return
					}
					_, _ = io.Copy(io.Discard, r.Body)
					w.WriteHeader(http.StatusNoContent)
				})
				s := openTestSandbox(t, Options{Runtime: rt}, srv.URL, rt == RuntimeLegacyPython, nil)
				waits := recordedSleeps(s)
				br := &blockingReader{release: make(chan struct{})}
				var once sync.Once
				unblock := func() { once.Do(func() { close(br.release) }) }
				t.Cleanup(unblock)
				var src io.Reader = br
				ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
				if end == "retry" {
					src = blockingSeeker{br}
				}
				if end == "cancel" {
					cancel()
					ctx, cancel = context.WithCancel(context.Background())
					time.AfterFunc(500*time.Millisecond, cancel)
				}
				defer cancel()
				done := make(chan error, 1)
				start := time.Now()
				go func() { done <- s.WriteFrom(ctx, "blocked.bin", src) }()
				var err error
				select {
				case err = <-done:
				case <-time.After(5 * time.Second):
					unblock()
					err = <-done
					t.Fatalf("WriteFrom still running 5 s after its context ended at 0.5 s; it returned only "+
						"when the reader did, after %s: %v", time.Since(start), err)
				}
				t.Logf("WriteFrom = %v", err)
				if took := time.Since(start); took > 3*time.Second {
					t.Errorf("WriteFrom took %s; its context ended at 0.5 s", took)
				}
				if end == "cancel" {
					if !errors.Is(err, context.Canceled) || errors.Is(err, ErrTimeout) {
						t.Errorf("WriteFrom cancelled = %v; want context.Canceled", err)
					}
				} else if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("WriteFrom past its deadline = %v; want ErrTimeout (context.DeadlineExceeded)", err)
				}
				if end == "retry" && len(*waits) != 1 {
					t.Errorf("waits before a retry = %v; want the one before the second attempt", *waits)
				}
				s.mu.Lock()
				inflight := s.inflight
				s.mu.Unlock()
				if inflight != 0 {
					t.Errorf("in-flight calls after WriteFrom returned: %d", inflight)
				}
			})
		}
	}
}

// A reader that does not block: WriteFrom has stopped reading it when it returns (the caller may reuse it),
// on success and after a failed attempt alike.
func TestWriteFromIsDoneWithTheReaderWhenItReturns(t *testing.T) {
	for _, rt := range []Runtime{RuntimeLegacyPython, RuntimeSandboxd} {
		t.Run(string(rt), func(t *testing.T) {
			url, bodies := flakyUploadServer(t)
			s := openTestSandbox(t, Options{Runtime: rt}, url, rt == RuntimeLegacyPython, nil)
			recordedSleeps(s)
			var buf bytes.Buffer
			buf.WriteString("payload")
			err := s.WriteFrom(context.Background(), "f.bin", &buf) // not seekable: one attempt, 503
			var he *HTTPError
			if !errors.As(err, &he) || he.StatusCode != http.StatusServiceUnavailable {
				t.Fatalf("WriteFrom = %v; want the 503", err)
			}
			buf.WriteString("reused") // a data race (-race) if a goroutine of the call still read buf
			if got := bodies(); len(got) != 1 {
				t.Fatalf("bodies = %q", got)
			}
			if err := s.WriteFrom(context.Background(), "f.bin", &buf); err != nil {
				t.Fatal(err)
			}
			buf.Reset()
			if got := bodies(); len(got) != 2 || got[1] != "reused" {
				t.Fatalf("bodies = %q", got)
			}
		})
	}
}
