package sandbox

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// flakyUploadServer answers 503 to the first upload and records every body it received.
func flakyUploadServer(t *testing.T) (string, func() []string) {
	var mu sync.Mutex
	var bodies []string
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		var body []byte
		if mr, err := r.MultipartReader(); err == nil {
			part, perr := mr.NextPart()
			if perr == nil {
				body, _ = io.ReadAll(part)
			}
		} else {
			body, _ = io.ReadAll(r.Body)
		}
		mu.Lock()
		bodies = append(bodies, string(body))
		n := len(bodies)
		mu.Unlock()
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	return srv.URL, func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), bodies...) }
}

func TestWriteFromRetriesOnlySeekableReaders(t *testing.T) {
	for _, rt := range []Runtime{RuntimeLegacyPython, RuntimeSandboxd} {
		t.Run(string(rt), func(t *testing.T) {
			url, bodies := flakyUploadServer(t)
			s := openTestSandbox(t, Options{Runtime: rt}, url, rt == RuntimeLegacyPython, nil)
			recordedSleeps(s)
			src := strings.NewReader("xxpayload")
			_, _ = src.Seek(2, io.SeekStart) // uploads start where the reader is
			if err := s.WriteFrom(context.Background(), "f.bin", src); err != nil {
				t.Fatal(err)
			}
			if got := bodies(); len(got) != 2 || got[0] != "payload" || got[1] != "payload" {
				t.Fatalf("seekable: bodies = %q", got)
			}

			url, bodies = flakyUploadServer(t)
			s = openTestSandbox(t, Options{Runtime: rt}, url, rt == RuntimeLegacyPython, nil)
			recordedSleeps(s)
			plain := io.MultiReader(strings.NewReader("once")) // not an io.Seeker
			var he *HTTPError
			if err := s.WriteFrom(context.Background(), "f.bin", plain); !errors.As(err, &he) || he.StatusCode != 503 {
				t.Fatalf("plain reader: %v", err)
			}
			if got := bodies(); len(got) != 1 {
				t.Fatalf("plain reader sent %d times", len(got))
			}
		})
	}
}

func TestWriteFromEnforcesMaxUploadSize(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	})
	s := openTestSandbox(t, Options{Runtime: RuntimeSandboxd, MaxUploadSize: 10}, srv.URL, false, nil)
	err := s.WriteFrom(context.Background(), "f", io.MultiReader(strings.NewReader(strings.Repeat("a", 11))))
	if !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("err = %v", err)
	}
}

func TestReadToStreamsWithALimit(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "0123456789") })
	s := openTestSandbox(t, Options{MaxDownloadSize: 10}, srv.URL, true, nil)
	var buf bytes.Buffer
	n, err := s.ReadTo(context.Background(), "f", &buf)
	if err != nil || n != 10 || buf.String() != "0123456789" {
		t.Fatalf("ReadTo = %d, %v, %q", n, err, buf.String())
	}
	s = openTestSandbox(t, Options{MaxDownloadSize: 9}, srv.URL, true, nil)
	if _, err := s.ReadTo(context.Background(), "f", io.Discard); !errors.Is(err, ErrResponseTooLarge) {
		t.Fatalf("over the limit: %v", err)
	}
}

// countingSeeker counts the rewinds of an upload source (one per attempt after the first).
type countingSeeker struct {
	*bytes.Reader
	rewinds int
}

func (c *countingSeeker) Seek(off int64, whence int) (int64, error) {
	if whence == io.SeekStart {
		c.rewinds++
	}
	return c.Reader.Seek(off, whence)
}

// An upload over MaxUploadSize fails the same way on every attempt: the first one ends the call. A seekable
// source used to be sent six times (each up to the limit), 7.7 s of backoff in between.
func TestWriteFromOverTheLimitIsNotRetried(t *testing.T) {
	for _, runtime := range []Runtime{RuntimeLegacyPython, RuntimeSandboxd} {
		t.Run(string(runtime), func(t *testing.T) {
			var requests atomic.Int32
			srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				requests.Add(1)
				_, _ = io.Copy(io.Discard, r.Body)
				w.WriteHeader(http.StatusNoContent)
			})
			s := openTestSandbox(t, Options{Runtime: runtime, MaxUploadSize: 64 << 10}, srv.URL,
				runtime == RuntimeLegacyPython, nil)
			waits := recordedSleeps(s)
			src := &countingSeeker{Reader: bytes.NewReader(make([]byte, 256<<10))}
			err := s.WriteFrom(context.Background(), "over.bin", src)
			if !errors.Is(err, ErrInvalidArgument) || errors.Is(err, ErrRetriesExhausted) ||
				!strings.Contains(err.Error(), "MaxUploadSize") || !strings.HasPrefix(err.Error(), "sandbox[") {
				t.Fatalf("err = %v, want ErrInvalidArgument naming MaxUploadSize, not retried", err)
			}
			if src.rewinds != 0 || len(*waits) != 0 || requests.Load() > 1 {
				t.Errorf("rewinds %d, waits %v, requests %d; want one attempt", src.rewinds, *waits, requests.Load())
			}
		})
	}
}
