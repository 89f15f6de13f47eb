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

// connectedTo connects a fake-cluster sandbox in the mode opts select (info as Open read it) to the test
// server that records the headers of every request: opts gets its URL and port.
func connectedTo(t *testing.T, opts func(url string, port int) Options, info sandboxInfo) (*Sandbox, *[]http.Header) {
	t.Helper()
	var mu sync.Mutex
	got := &[]http.Header{}
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		*got = append(*got, r.Header.Clone())
		mu.Unlock()
		_, _ = io.WriteString(w, `{"exists": true}`)
	})
	port, err := strconv.Atoi(srv.URL[strings.LastIndex(srv.URL, ":")+1:])
	if err != nil {
		t.Fatal(err)
	}
	o := opts(srv.URL, port)
	o.Quiet, o.Namespace = true, "ns"
	o.setDefaults()
	if err := o.validate(); err != nil {
		t.Fatal(err)
	}
	s, _ := fakeCluster(t)
	s.opts = o
	c, err := s.connect(context.Background(), "sb", info)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.close)
	s.claimName, s.sandboxName, s.info, s.conn = "claim-1", "sb", info, c
	return s, got
}

// Options.Headers carry the router's credentials: they go to a router or a gateway, never to the sandbox
// (whose code is not trusted with them). They used to go to the pod IP, the Service and sandboxd's pod too.
func TestHeadersGoOnlyToARouter(t *testing.T) {
	secret := http.Header{"Authorization": {"Bearer SECRET-ROUTER-TOKEN"}, "X-Tenant": {"a"}}
	for _, tc := range []struct {
		name string
		opts func(url string, port int) Options
		info sandboxInfo
		sent bool
	}{
		{"pod IP, legacy", func(_ string, port int) Options {
			return Options{Connectivity: ConnectivityInCluster, ServerPort: port}
		}, sandboxInfo{podIP: "127.0.0.1"}, false},
		{"pod IP, sandboxd", func(_ string, port int) Options {
			return Options{Connectivity: ConnectivityInCluster, Runtime: RuntimeSandboxd, SandboxdRESTPort: port,
				SandboxdGRPCPort: 1}
		}, sandboxInfo{podIP: "127.0.0.1"}, false},
		{"Service, legacy", func(_ string, port int) Options {
			return Options{Connectivity: ConnectivityInClusterService, ServerPort: port}
		}, sandboxInfo{podIP: "10.0.0.1", serviceFQDN: "127.0.0.1"}, false},
		{"router URL, legacy", func(url string, _ int) Options {
			return Options{APIURL: url}
		}, sandboxInfo{podIP: "10.0.0.1"}, true},
		{"router URL, sandboxd", func(url string, _ int) Options {
			return Options{APIURL: url, Runtime: RuntimeSandboxd}
		}, sandboxInfo{podIP: "10.0.0.1"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, got := connectedTo(t, func(url string, port int) Options {
				o := tc.opts(url, port)
				o.Headers = secret
				return o
			}, tc.info)
			if _, err := s.Exists(context.Background(), "a.txt"); err != nil {
				t.Fatal(err)
			}
			if len(*got) != 1 {
				t.Fatalf("%d requests", len(*got))
			}
			h := (*got)[0]
			if sent := h.Get("Authorization") != "" || h.Get("X-Tenant") != ""; sent != tc.sent {
				t.Errorf("Authorization %q, X-Tenant %q sent; want sent %v", h.Get("Authorization"), h.Get("X-Tenant"), tc.sent)
			}
		})
	}
	// the port-forward modes: to the router Pod (and the gateway) yes, to sandboxd's Pod no
	for _, tc := range []struct {
		opts Options
		want bool
	}{
		{Options{}, true},
		{Options{GatewayName: "gw"}, true},
		{Options{Runtime: RuntimeSandboxd}, false},
	} {
		tc.opts.setDefaults()
		if tc.opts.toRouter() != tc.want {
			t.Errorf("%+v: toRouter = %v, want %v", tc.opts, !tc.want, tc.want)
		}
	}
}

// A router in scoped-token authz mode refuses any request naming a pod IP (403): with a scoped token in the
// Authorization header the pod IP is left out, as the Python SDK does. It used to be sent unless the user
// knew to set DisablePodIPRouting.
func TestScopedTokenLeavesThePodIPOut(t *testing.T) {
	for _, tc := range []struct {
		headers http.Header
		disable bool
		podIP   bool
	}{
		{http.Header{"Authorization": {"Bearer v1.eyJucyI6Im5zIn0.c2lnbmF0dXJl"}}, false, false},
		{http.Header{"authorization": {"  bearer V1.a_b-c.D-e_f  "}}, false, false},
		{http.Header{"Authorization": {"Bearer static-router-token"}}, false, true},
		{http.Header{"Authorization": {"Bearer v1.only-two"}}, false, true},
		{http.Header{"Authorization": {"Bearer v1.a.b.c"}}, false, true},
		{http.Header{"Authorization": {"Basic v1.a.b"}}, false, true},
		{http.Header{"X-Token": {"Bearer v1.a.b"}}, false, true},
		{nil, false, true},
		{http.Header{"Authorization": {"Bearer static-router-token"}}, true, false},
	} {
		s, got := connectedTo(t, func(url string, _ int) Options {
			return Options{APIURL: url, Headers: tc.headers, DisablePodIPRouting: tc.disable}
		}, sandboxInfo{podIP: "10.0.0.9"})
		if _, err := s.Exists(context.Background(), "a.txt"); err != nil {
			t.Fatal(err)
		}
		if ip := (*got)[0].Get("X-Sandbox-Pod-Ip"); (ip == "10.0.0.9") != tc.podIP {
			t.Errorf("headers %v, DisablePodIPRouting %v: X-Sandbox-Pod-IP %q; want sent %v", tc.headers, tc.disable, ip, tc.podIP)
		}
		if (*got)[0].Get("X-Sandbox-Id") != "sb" {
			t.Errorf("X-Sandbox-ID = %q, want sb", (*got)[0].Get("X-Sandbox-Id"))
		}
	}
}

// The router's timer is X-Sandbox-Timeout, the time left in the call: its 504 races the call's deadline and
// is ErrTimeout (also context.DeadlineExceeded) when it arrives within a second of it. A Run used to come back
// as the *HTTPError 504. Any other 504, or one well before the deadline, stays the router's answer.
func TestRouterTimeoutAtTheDeadlineIsErrTimeout(t *testing.T) {
	for _, tc := range []struct {
		name     string
		timeout  time.Duration
		detail   string
		deadline bool
	}{
		{"X-Sandbox-Timeout at the deadline", 500 * time.Millisecond,
			"Timed out waiting for the backend sandbox: sbx-1 (no response within 0.5 s: X-Sandbox-Timeout)", true},
		{"X-Sandbox-Timeout long before the deadline", 30 * time.Second,
			"Timed out waiting for the backend sandbox: sbx-1 (no response within 5 s: X-Sandbox-Timeout)", false},
		{"the router's own cap", 500 * time.Millisecond, "Timed out waiting for the backend sandbox: sbx-1 " +
			"(no response within 0.2 s: X-Sandbox-Timeout 0.5 s, capped by the router's --proxy-timeout)", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusGatewayTimeout)
				_, _ = fmt.Fprintf(w, `{"detail": %q}`, tc.detail)
			})
			s := openTestSandbox(t, Options{}, srv.URL, true, nil)
			ctx, cancel := context.WithTimeout(context.Background(), tc.timeout)
			defer cancel()
			_, err := s.Run(ctx, "sleep 60")
			var he *HTTPError
			timedOut := errors.Is(err, ErrTimeout) && errors.Is(err, context.DeadlineExceeded) &&
				strings.HasPrefix(err.Error(), "sandbox[") && strings.Contains(err.Error(), "X-Sandbox-Timeout")
			if tc.deadline && !timedOut {
				t.Fatalf("err = %v; want ErrTimeout (and context.DeadlineExceeded) naming the router's 504", err)
			}
			if !tc.deadline && (errors.Is(err, ErrTimeout) || !errors.As(err, &he) || he.StatusCode != 504) {
				t.Fatalf("err = %v; want the router's 504", err)
			}
		})
	}
}

// A deadline met while the body is read (the answer had begun) is ErrTimeout too, as the docs promise; it was
// only context.DeadlineExceeded.
func TestDeadlineWhileReadingTheBodyIsErrTimeout(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, strings.Repeat("x", 1000))
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	})
	for _, runtime := range []Runtime{RuntimeLegacyPython, RuntimeSandboxd} {
		s := openTestSandbox(t, Options{Runtime: runtime}, srv.URL, runtime == RuntimeLegacyPython, nil)
		_, err := s.Read(context.Background(), "slow.bin", WithTimeout(300*time.Millisecond))
		if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) || !strings.HasPrefix(err.Error(), "sandbox[") {
			t.Errorf("%s: err = %v; want ErrTimeout (and context.DeadlineExceeded)", runtime, err)
		}
	}
}
