package sandbox

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
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
