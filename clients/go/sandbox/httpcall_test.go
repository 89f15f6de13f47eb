package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestRouterHeadersOnEveryRequest(t *testing.T) {
	var mu sync.Mutex
	var got []http.Header
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Clone())
		mu.Unlock()
		_, _ = io.WriteString(w, `{"exists": true}`)
	})
	s := openTestSandbox(t, Options{Namespace: "team-a", ServerPort: 9999,
		Headers: http.Header{"Authorization": {"Bearer tok"}}}, srv.URL, true, nil)
	if _, err := s.Exists(context.Background(), "a.txt", WithTimeout(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	h := got[0]
	for name, want := range map[string]string{
		"X-Sandbox-Id": "sbx-1", "X-Sandbox-Namespace": "team-a", "X-Sandbox-Port": "9999",
		"X-Sandbox-Pod-Ip": "10.1.2.3", "Authorization": "Bearer tok",
	} {
		if h.Get(name) != want {
			t.Errorf("%s = %q, want %q", name, h.Get(name), want)
		}
	}
	if !regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(h.Get("X-Request-Id")) {
		t.Errorf("X-Request-ID = %q, want 16 hex chars", h.Get("X-Request-Id"))
	}
	// seconds left in the call
	secs, err := strconv.ParseFloat(h.Get("X-Sandbox-Timeout"), 64)
	if err != nil || secs <= 29 || secs > 30 {
		t.Errorf("X-Sandbox-Timeout = %q, want just under 30", h.Get("X-Sandbox-Timeout"))
	}
	// not capped at PerAttemptTimeout (60 s): the router bounds the whole exchange by it
	got = nil
	if _, err := s.Exists(context.Background(), "a.txt"); err != nil {
		t.Fatal(err)
	}
	if secs, _ := strconv.ParseFloat(got[0].Get("X-Sandbox-Timeout"), 64); secs <= 179 || secs > 180 {
		t.Errorf("X-Sandbox-Timeout with the default RequestTimeout = %q, want just under 180", got[0].Get("X-Sandbox-Timeout"))
	}
}

func TestNoRouterHeadersWhenDirectToPod(t *testing.T) {
	var h http.Header
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		h = r.Header.Clone()
		_, _ = io.WriteString(w, `{"exists": false}`)
	})
	s := openTestSandbox(t, Options{}, srv.URL, false, nil)
	if _, err := s.Exists(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	for name := range h {
		if strings.HasPrefix(name, "X-Sandbox-") {
			t.Errorf("unexpected router header %s", name)
		}
	}
	if h.Get("X-Request-Id") == "" {
		t.Error("X-Request-ID missing")
	}
}

func TestFileCallsRetry5xxWithBackoffThenSucceed(t *testing.T) {
	var n atomic.Int32
	var ids sync.Map
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		ids.Store(r.Header.Get("X-Request-Id"), true)
		if n.Add(1) < 4 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "content")
	})
	s := openTestSandbox(t, Options{}, srv.URL, true, nil)
	waits := recordedSleeps(s)
	b, err := s.Read(context.Background(), "f.txt")
	if err != nil || string(b) != "content" {
		t.Fatalf("Read = %q, %v", b, err)
	}
	if n.Load() != 4 {
		t.Errorf("attempts = %d, want 4", n.Load())
	}
	want := []time.Duration{0, 500 * time.Millisecond, time.Second}
	if len(*waits) != len(want) {
		t.Fatalf("waits = %v, want %v", *waits, want)
	}
	for i := range want {
		if (*waits)[i] != want[i] {
			t.Errorf("wait %d = %v, want %v", i, (*waits)[i], want[i])
		}
	}
	count := 0
	ids.Range(func(any, any) bool { count++; return true })
	if count != 1 {
		t.Errorf("%d distinct X-Request-IDs across retries, want 1", count)
	}
}

func TestBackoffScheduleAndJitterBounds(t *testing.T) {
	want := []time.Duration{0, 500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 8 * time.Second}
	for i, w := range want {
		n := i + 2
		if got := backoff(n, 0.5); got != w {
			t.Errorf("backoff(%d) = %v, want %v", n, got, w)
		}
		lo, hi := backoff(n, 0), backoff(n, 0.999999)
		if lo < time.Duration(float64(w)*0.75) || hi > time.Duration(float64(w)*1.25) {
			t.Errorf("backoff(%d) jitter range [%v, %v] outside +-25%% of %v", n, lo, hi, w)
		}
	}
}

func TestRetriesExhaustedWrapsLastHTTPError(t *testing.T) {
	var n atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadGateway)
		_, _ = io.WriteString(w, `{"detail":"Could not connect to the backend sandbox: sbx-1"}`)
	})
	s := openTestSandbox(t, Options{}, srv.URL, true, nil)
	recordedSleeps(s)
	_, err := s.List(context.Background(), ".")
	if !errors.Is(err, ErrRetriesExhausted) {
		t.Fatalf("err = %v, want ErrRetriesExhausted", err)
	}
	var he *HTTPError
	if !errors.As(err, &he) || he.StatusCode != 502 || he.Body != "Could not connect to the backend sandbox: sbx-1" {
		t.Fatalf("HTTPError = %+v", he)
	}
	if n.Load() != defaultFileAttempts {
		t.Errorf("attempts = %d, want %d", n.Load(), defaultFileAttempts)
	}
	if !strings.HasPrefix(err.Error(), "sandbox[default/claim-1]: ") {
		t.Errorf("error lacks the sandbox prefix: %v", err)
	}
}

func TestRunIsNotRetriedByDefault(t *testing.T) {
	var n atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	s := openTestSandbox(t, Options{}, srv.URL, true, nil)
	recordedSleeps(s)
	_, err := s.Run(context.Background(), "echo hi")
	var he *HTTPError
	if !errors.As(err, &he) || he.StatusCode != 503 || errors.Is(err, ErrRetriesExhausted) {
		t.Fatalf("err = %v", err)
	}
	if n.Load() != 1 {
		t.Errorf("attempts = %d, want 1", n.Load())
	}
	n.Store(0)
	_, _ = s.Run(context.Background(), "echo hi", WithMaxAttempts(3))
	if n.Load() != 3 {
		t.Errorf("attempts with WithMaxAttempts(3) = %d", n.Load())
	}
}

func TestClientErrorsAreNotRetried(t *testing.T) {
	var n atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.WriteHeader(http.StatusForbidden)
		_, _ = io.WriteString(w, `{"message":"Access denied"}`)
	})
	s := openTestSandbox(t, Options{}, srv.URL, true, nil)
	_, err := s.Read(context.Background(), "x")
	var he *HTTPError
	if !errors.As(err, &he) || he.StatusCode != 403 || he.Body != "Access denied" || n.Load() != 1 {
		t.Fatalf("err = %v (attempts %d)", err, n.Load())
	}
	if he.Operation != "read (GET download/x)" {
		t.Errorf("Operation = %q", he.Operation)
	}
}

func TestRedirectsAreNotFollowed(t *testing.T) {
	var other atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/elsewhere" {
			other.Add(1)
			return
		}
		http.Redirect(w, r, "/elsewhere", http.StatusFound)
	})
	s := openTestSandbox(t, Options{}, srv.URL, true, nil)
	_, err := s.Read(context.Background(), "x")
	var he *HTTPError
	if !errors.As(err, &he) || he.StatusCode != http.StatusFound || other.Load() != 0 {
		t.Fatalf("err = %v, followed = %d", err, other.Load())
	}
}

func TestPerAttemptHeaderTimeoutRetries(t *testing.T) {
	var n atomic.Int32
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	s := openTestSandbox(t, Options{PerAttemptTimeout: 100 * time.Millisecond}, srv.URL, true, nil)
	recordedSleeps(s)
	b, err := s.Read(context.Background(), "x")
	if err != nil || string(b) != "ok" || n.Load() != 2 {
		t.Fatalf("Read = %q, %v after %d attempts", b, err, n.Load())
	}
}

func TestCallDeadlineIsErrTimeout(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	})
	s := openTestSandbox(t, Options{}, srv.URL, true, nil)
	_, err := s.Read(context.Background(), "x", WithTimeout(100*time.Millisecond))
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want ErrTimeout and DeadlineExceeded", err)
	}
}

func TestBodyIsResentOnRetry(t *testing.T) {
	var mu sync.Mutex
	var bodies []string
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		n := len(bodies)
		mu.Unlock()
		if n == 1 {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	s := openTestSandbox(t, Options{Runtime: RuntimeSandboxd}, srv.URL, false, nil)
	recordedSleeps(s)
	if err := s.Write(context.Background(), "d/f.bin", []byte("payload")); err != nil {
		t.Fatal(err)
	}
	if len(bodies) != 2 || bodies[0] != "payload" || bodies[1] != "payload" {
		t.Fatalf("bodies = %q", bodies)
	}
}

func TestNotOpenIsErrNotReady(t *testing.T) {
	s := openTestSandbox(t, Options{}, "http://127.0.0.1:1", true, nil)
	_ = s.Disconnect(context.Background())
	if _, err := s.Run(context.Background(), "true"); !errors.Is(err, ErrNotReady) {
		t.Fatalf("err = %v", err)
	}
	if s.IsReady() {
		t.Error("IsReady after Disconnect")
	}
}

func TestDeadTunnelIsErrNotReadyWrappingPortForwardDied(t *testing.T) {
	s := openTestSandbox(t, Options{}, "http://127.0.0.1:1", true, nil)
	died := make(chan struct{})
	close(died)
	s.conn.died, s.conn.dieErr = died, func() error { return errors.New("lost connection to pod") }
	_, err := s.Read(context.Background(), "x")
	if !errors.Is(err, ErrNotReady) || !errors.Is(err, ErrPortForwardDied) {
		t.Fatalf("err = %v", err)
	}
}

func TestRenderErrorBody(t *testing.T) {
	for in, want := range map[string]string{
		`{"code":"NOT_FOUND","message":"path does not exist within the sandbox"}`: "NOT_FOUND: path does not exist within the sandbox",
		`{"detail":"Invalid sandbox ID format."}`:                                 "Invalid sandbox ID format.",
		`{"detail":[{"loc":["body"]}]}`:                                           `{"detail":[{"loc":["body"]}]}`,
		`{"message":"File not found"}`:                                            "File not found",
		"plain text":                                                              "plain text",
		strings.Repeat("x", 600):                                                  strings.Repeat("x", 512),
	} {
		if got := renderErrorBody([]byte(in)); got != want {
			t.Errorf("renderErrorBody(%.40q) = %.60q, want %.60q", in, got, want)
		}
	}
	e := &HTTPError{StatusCode: 500, Body: strings.Repeat("y", 300), Operation: "read (GET download/x)"}
	if msg := e.Error(); !strings.HasPrefix(msg, "read (GET download/x) returned status 500: ") ||
		!strings.HasSuffix(msg, "... [truncated]") {
		t.Errorf("Error() = %q", msg)
	}
}

// The Sandbox was suspended and resumed behind the handle's back (the lifecycle controller, another
// client, the CLI): its pod moved from 10.1.2.3 to 10.9.9.9.
func movedPodServer(t *testing.T, refusal int) (*[]string, *httptest.Server) {
	var mu sync.Mutex
	sent := []string{}
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		ip := r.Header.Get("X-Sandbox-Pod-Ip")
		mu.Lock()
		sent = append(sent, ip)
		mu.Unlock()
		if ip != "" && ip != "10.9.9.9" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(refusal)
			if refusal == http.StatusForbidden { // a router with the Pod cache checks the address
				_, _ = io.WriteString(w, `{"detail":"X-Sandbox-Pod-IP `+ip+` does not belong to sandbox sbx-1"}`)
			} else { // one without dials it
				_, _ = io.WriteString(w, `{"detail":"Could not connect to the backend sandbox: sbx-1"}`)
			}
			return
		}
		_, _ = io.WriteString(w, `{"stdout":"ok\n","stderr":"","exit_code":0,"exists":true}`)
	})
	return &sent, srv
}

func lookupsOf(s *Sandbox) *atomic.Int32 {
	var n atomic.Int32
	s.conn.ep.lookupPodIP = func(context.Context) (string, error) { n.Add(1); return "10.9.9.9", nil }
	return &n
}

// The router refuses the stale X-Sandbox-Pod-IP: the call is sent again at once without it (refused before
// anything was forwarded), and the next call reads the Sandbox's new one. Every call used to repeat the 403.
func TestStalePodIPRefusalResendsWithoutTheIP(t *testing.T) {
	sent, srv := movedPodServer(t, http.StatusForbidden)
	s := openTestSandbox(t, Options{}, srv.URL, true, nil)
	waits := recordedSleeps(s)
	lookups := lookupsOf(s)
	for i := 0; i < 3; i++ {
		res, err := s.Run(context.Background(), "echo ok")
		if err != nil || res.Stdout != "ok\n" {
			t.Fatalf("run %d: %+v, %v", i, res, err)
		}
	}
	if want := []string{"10.1.2.3", "", "10.9.9.9", "10.9.9.9"}; strings.Join(*sent, ",") != strings.Join(want, ",") {
		t.Errorf("X-Sandbox-Pod-IP sent = %q, want %q", *sent, want)
	}
	if len(*waits) != 0 || lookups.Load() != 1 {
		t.Errorf("waits %v, lookups %d; want none and 1", *waits, lookups.Load())
	}
}

// A router without the Pod cache dials the stale address and answers 502: the Sandbox is read again before
// the next attempt (file calls retry) and the next call.
func TestBadGatewayRereadsThePodIP(t *testing.T) {
	sent, srv := movedPodServer(t, http.StatusBadGateway)
	s := openTestSandbox(t, Options{}, srv.URL, true, nil)
	recordedSleeps(s)
	lookups := lookupsOf(s)
	if ok, err := s.Exists(context.Background(), "a.txt"); err != nil || !ok {
		t.Fatalf("exists = %v, %v", ok, err)
	}
	if _, err := s.Run(context.Background(), "echo ok"); err != nil {
		t.Fatal(err)
	}
	if want := []string{"10.1.2.3", "10.9.9.9", "10.9.9.9"}; strings.Join(*sent, ",") != strings.Join(want, ",") {
		t.Errorf("X-Sandbox-Pod-IP sent = %q, want %q", *sent, want)
	}
	if lookups.Load() != 1 {
		t.Errorf("lookups = %d, want 1", lookups.Load())
	}
}

// Any other 403 is the caller's (authorization): returned as it is, the IP kept.
func TestOtherForbiddenKeepsThePodIP(t *testing.T) {
	var calls atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusForbidden)
		_, _ = io.WriteString(w, `{"detail":"forbidden"}`)
	})
	s := openTestSandbox(t, Options{}, srv.URL, true, nil)
	lookups := lookupsOf(s)
	var httpErr *HTTPError
	if _, err := s.Run(context.Background(), "true"); !errors.As(err, &httpErr) || httpErr.StatusCode != 403 {
		t.Fatalf("err = %v, want the 403", err)
	}
	if calls.Load() != 1 || s.conn.ep.currentPodIP() != "10.1.2.3" || lookups.Load() != 0 {
		t.Errorf("calls = %d, pod IP = %q, lookups %d; want 1, kept, 0", calls.Load(), s.conn.ep.currentPodIP(), lookups.Load())
	}
}

// The Sandbox was deleted (another process, its claim's expiry) or suspended (the CLI, the idle-timeout
// controller; a router that does not resume) behind the handle's back: once the re-read after the router's
// 502 says so, the call ends with ErrSandboxDeleted / ErrNotReady and the 502. A read used to go through all six
// attempts first (15.5 s of backoff, each attempt a few seconds of the router's own retries).
func TestAReadFromAnUnreachableSandboxStopsAtTheFirstLookup(t *testing.T) {
	for _, tc := range []struct {
		name   string
		lookup error
	}{
		{"deleted", fmt.Errorf("Sandbox sbx-1 no longer exists: %w", ErrSandboxDeleted)},
		{"suspended", fmt.Errorf("Sandbox sbx-1 is suspended: %w", ErrNotReady)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sent, srv := movedPodServer(t, http.StatusBadGateway)
			s := openTestSandbox(t, Options{}, srv.URL, true, nil)
			waits := recordedSleeps(s)
			var lookups atomic.Int32
			s.conn.ep.lookupPodIP = func(context.Context) (string, error) {
				lookups.Add(1)
				return "", tc.lookup
			}
			_, err := s.Exists(context.Background(), "a.txt")
			var httpErr *HTTPError
			if !errors.Is(err, errors.Unwrap(tc.lookup)) || !errors.As(err, &httpErr) || httpErr.StatusCode != http.StatusBadGateway {
				t.Fatalf("err = %v, want %v with the 502", err, errors.Unwrap(tc.lookup))
			}
			var waited time.Duration
			for _, w := range *waits {
				waited += w
			}
			if len(*sent) != 1 || lookups.Load() != 1 || waited != 0 {
				t.Errorf("attempts %q, lookups %d, waits %v; want 1, 1, none", *sent, lookups.Load(), *waits)
			}
		})
	}
}
