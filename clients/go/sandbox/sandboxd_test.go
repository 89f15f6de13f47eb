package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	processv1 "agent-sandbox.invalid/clients/go/internal/processv1"
)

// fakeProcessService is an in-memory process.v1 server: Execute echoes its request; Start streams a script
// driven by WriteStdin / SendSignal / ResizeTTY.
type fakeProcessService struct {
	processv1.UnimplementedProcessServiceServer
	mu       sync.Mutex
	execReqs []*processv1.ExecuteRequest
	startReq *processv1.StartRequest
	stdin    chan []byte // nil entry = EOF
	signals  chan processv1.Signal
	resized  chan [2]uint32
	block    bool // Execute blocks until the client gives up
	execErr  error
}

func newFakeProcessService() *fakeProcessService {
	return &fakeProcessService{stdin: make(chan []byte, 16), signals: make(chan processv1.Signal, 4),
		resized: make(chan [2]uint32, 4)}
}

func (f *fakeProcessService) Execute(ctx context.Context, req *processv1.ExecuteRequest) (*processv1.ExecuteResponse, error) {
	f.mu.Lock()
	f.execReqs = append(f.execReqs, req)
	block, execErr := f.block, f.execErr
	f.mu.Unlock()
	if block {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if execErr != nil {
		return nil, execErr
	}
	return &processv1.ExecuteResponse{ExitCode: 7, Stdout: []byte("out:" + strings.Join(req.GetConfig().GetCommand(), "|")),
		Stderr: []byte("err")}, nil
}

// Start: init(5), "hello" on stdout, then echoes stdin to stdout until EOF (exit 0), or exits -1 on a
// signal; a resize is reported on stderr.
func (f *fakeProcessService) Start(req *processv1.StartRequest, stream grpc.ServerStreamingServer[processv1.StartResponse]) error {
	f.mu.Lock()
	f.startReq = req
	f.mu.Unlock()
	send := func(r *processv1.StartResponse) error { return stream.Send(r) }
	if err := send(&processv1.StartResponse{Event: &processv1.StartResponse_Init{Init: &processv1.InitEvent{ProcessId: 5}}}); err != nil {
		return err
	}
	if err := send(&processv1.StartResponse{Event: &processv1.StartResponse_Stdout{Stdout: []byte("hello")}}); err != nil {
		return err
	}
	for {
		select {
		case <-stream.Context().Done():
			return stream.Context().Err()
		case b := <-f.stdin:
			if b == nil {
				return send(&processv1.StartResponse{Event: &processv1.StartResponse_Exit{Exit: &processv1.ExitEvent{ExitCode: 0}}})
			}
			if err := send(&processv1.StartResponse{Event: &processv1.StartResponse_Stdout{Stdout: b}}); err != nil {
				return err
			}
		case <-f.signals:
			return send(&processv1.StartResponse{Event: &processv1.StartResponse_Exit{Exit: &processv1.ExitEvent{ExitCode: -1}}})
		case sz := <-f.resized:
			msg := fmt.Sprintf("%dx%d", sz[0], sz[1])
			if err := send(&processv1.StartResponse{Event: &processv1.StartResponse_Stderr{Stderr: []byte(msg)}}); err != nil {
				return err
			}
		}
	}
}

func (f *fakeProcessService) WriteStdin(_ context.Context, req *processv1.WriteStdinRequest) (*processv1.WriteStdinResponse, error) {
	if req.GetProcessId() != 5 {
		return nil, status.Error(codes.NotFound, "no such process")
	}
	if req.GetEof() != nil {
		f.stdin <- nil
	} else {
		f.stdin <- req.GetInput()
	}
	return &processv1.WriteStdinResponse{}, nil
}

func (f *fakeProcessService) SendSignal(_ context.Context, req *processv1.SendSignalRequest) (*processv1.SendSignalResponse, error) {
	if req.GetSignal() == processv1.Signal_SIGNAL_UNSPECIFIED {
		return nil, status.Error(codes.InvalidArgument, "signal is required")
	}
	f.signals <- req.GetSignal()
	return &processv1.SendSignalResponse{}, nil
}

func (f *fakeProcessService) ResizeTTY(_ context.Context, req *processv1.ResizeTTYRequest) (*processv1.ResizeTTYResponse, error) {
	f.resized <- [2]uint32{req.GetCols(), req.GetRows()}
	return &processv1.ResizeTTYResponse{}, nil
}

func sandboxdTestSandbox(t *testing.T, f *fakeProcessService, rest string) *Sandbox {
	t.Helper()
	if rest == "" {
		rest = "http://127.0.0.1:1"
	}
	return openTestSandbox(t, Options{Runtime: RuntimeSandboxd}, rest, false, startGRPC(t, f))
}

func TestSandboxdRunWrapsCommandInShell(t *testing.T) {
	f := newFakeProcessService()
	s := sandboxdTestSandbox(t, f, "")
	res, err := s.Run(context.Background(), "echo $HOME", WithEnv(map[string]string{"K": "v"}), WithCwd("sub"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Stdout != "out:/bin/sh|-c|echo $HOME" || res.Stderr != "err" || res.ExitCode != 7 {
		t.Errorf("result = %+v", res)
	}
	cfg := f.execReqs[0].GetConfig()
	if cfg.GetEnvVars()["K"] != "v" || cfg.GetCwd() != "sub" {
		t.Errorf("config = %v", cfg)
	}
	if _, err := s.Run(context.Background(), "true"); err != nil {
		t.Fatal(err)
	}
	if f.execReqs[1].GetConfig().Cwd != nil {
		t.Error("cwd sent although not set")
	}
}

func TestSandboxdCommandTimeoutIsATimedOutResult(t *testing.T) {
	f := newFakeProcessService()
	f.block = true
	s := sandboxdTestSandbox(t, f, "")
	res, err := s.Run(context.Background(), "sleep 100", WithCommandTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 124 || !res.TimedOut || res.Stderr != "Command timed out after 0.2 seconds" {
		t.Errorf("result = %+v", res)
	}
}

func TestSandboxdCallDeadlineIsAnError(t *testing.T) {
	f := newFakeProcessService()
	f.block = true
	s := sandboxdTestSandbox(t, f, "")
	_, err := s.Run(context.Background(), "sleep 100", WithTimeout(150*time.Millisecond))
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v", err)
	}
}

func TestSandboxdGRPCErrorsKeepTheStatus(t *testing.T) {
	f := newFakeProcessService()
	f.execErr = status.Error(codes.NotFound, "program not found")
	s := sandboxdTestSandbox(t, f, "")
	_, err := s.Run(context.Background(), "nope")
	if status.Code(errors.Unwrap(errors.Unwrap(err))) != codes.NotFound && !strings.Contains(err.Error(), "(NotFound)") {
		t.Fatalf("err = %v", err)
	}
	var st interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &st) || st.GRPCStatus().Code() != codes.NotFound {
		t.Fatalf("gRPC status not reachable with errors.As: %v", err)
	}
	// Unavailable is retried only with WithMaxAttempts
	f.execErr = status.Error(codes.Unavailable, "down")
	recordedSleeps(s)
	_, err = s.Run(context.Background(), "x", WithMaxAttempts(3))
	if !errors.Is(err, ErrRetriesExhausted) || len(f.execReqs) != 4 {
		t.Fatalf("err = %v after %d requests", err, len(f.execReqs))
	}
}

func TestSandboxdStartStdinSignalResize(t *testing.T) {
	f := newFakeProcessService()
	s := sandboxdTestSandbox(t, f, "")
	ctx := context.Background()
	p, err := s.Start(ctx, "cat", WithPTY(80, 24))
	if err != nil {
		t.Fatal(err)
	}
	if p.ID() != 5 || f.startReq.GetPty().GetCols() != 80 || f.startReq.GetPty().GetRows() != 24 {
		t.Fatalf("id %d start %v", p.ID(), f.startReq)
	}
	next := func() Event {
		t.Helper()
		ev, err := p.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return ev
	}
	if ev := next(); ev.Type != EventStdout || string(ev.Data) != "hello" {
		t.Fatalf("first event %+v", ev)
	}
	if err := p.WriteStdin(ctx, []byte("ping")); err != nil {
		t.Fatal(err)
	}
	if ev := next(); string(ev.Data) != "ping" {
		t.Fatalf("echo %+v", ev)
	}
	if err := p.ResizeTTY(ctx, 100, 40); err != nil {
		t.Fatal(err)
	}
	if ev := next(); ev.Type != EventStderr || string(ev.Data) != "100x40" {
		t.Fatalf("resize %+v", ev)
	}
	if err := p.Signal(ctx, SignalTerminate); err != nil {
		t.Fatal(err)
	}
	if ev := next(); ev.Type != EventExit || ev.ExitCode != -1 {
		t.Fatalf("exit %+v", ev)
	}
	if _, err := p.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after exit: %v", err)
	}
	if s.inflight != 0 {
		t.Errorf("in-flight = %d after exit", s.inflight)
	}
}

func TestSandboxdRunWithStdin(t *testing.T) {
	f := newFakeProcessService()
	s := sandboxdTestSandbox(t, f, "")
	var out bytes.Buffer
	res, err := s.Run(context.Background(), "cat", WithStdin(strings.NewReader("data")), WithStdout(&out))
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != "hellodata" || res.ExitCode != 0 {
		t.Fatalf("out %q result %+v", out.String(), res)
	}
}

func TestSandboxdStartCommandTimeout(t *testing.T) {
	f := newFakeProcessService()
	s := sandboxdTestSandbox(t, f, "")
	res, err := s.Run(context.Background(), "cat", WithStdout(io.Discard), WithCommandTimeout(150*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 124 || !res.TimedOut {
		t.Fatalf("result %+v", res)
	}
}

func TestSandboxdProcessCloseEndsStream(t *testing.T) {
	f := newFakeProcessService()
	s := sandboxdTestSandbox(t, f, "")
	p, err := s.Start(context.Background(), "cat")
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Close()
	if _, err := p.Recv(); err == nil {
		t.Fatal("Recv after Close succeeded")
	}
	if s.inflight != 0 {
		t.Errorf("in-flight = %d after Close", s.inflight)
	}
}

func TestSandboxdRESTWire(t *testing.T) {
	type seen struct{ method, rawPath, query, ctype, body string }
	var got []seen
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = append(got, seen{r.Method, r.URL.EscapedPath(), r.URL.RawQuery, r.Header.Get("Content-Type"), string(b)})
		switch {
		case r.Method == http.MethodPut, r.Method == http.MethodDelete:
			w.WriteHeader(http.StatusNoContent)
		case r.Method == http.MethodHead && strings.Contains(r.URL.EscapedPath(), "missing"):
			w.WriteHeader(http.StatusNotFound)
		case r.Method == http.MethodHead:
		case strings.HasSuffix(r.URL.EscapedPath(), "dir"):
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"path":"/dir","entries":[`+
				`{"name":"a","size":1,"type":"file","modified_at":"2024-05-01T10:00:00Z","mode":"0644"},`+
				`{"name":"l","size":0,"type":"symlink","modified_at":"2024-05-01T10:00:00Z","mode":"0777"},`+
				`{"name":"d","size":0,"type":"directory","modified_at":"2024-05-01T10:00:01Z","mode":"0755"}]}`)
		case strings.HasSuffix(r.URL.EscapedPath(), "plainfile"):
			_, _ = io.WriteString(w, "plain file")
		default:
			_, _ = io.WriteString(w, "file bytes")
		}
	})
	s := sandboxdTestSandbox(t, newFakeProcessService(), srv.URL)
	ctx := context.Background()
	if err := s.Write(ctx, "dir/a b?.txt", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if b, err := s.Read(ctx, "dir/a b?.txt"); err != nil || string(b) != "file bytes" {
		t.Fatal(b, err)
	}
	entries, err := s.List(ctx, "dir")
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 || entries[0].Mode != "0644" || entries[1].Type != FileTypeDirectory ||
		!entries[1].ModTime.Equal(time.Date(2024, 5, 1, 10, 0, 1, 0, time.UTC)) {
		t.Errorf("entries = %+v", entries)
	}
	if _, err := s.List(ctx, "plainfile"); err == nil {
		t.Error("listing a file succeeded")
	}
	if b, err := s.Read(ctx, "dir"); err == nil || !strings.Contains(err.Error(), "dir is a directory, not a file") {
		t.Errorf("Read(dir) = %q, %v; want the directory refused, not its listing as the file", b, err)
	}
	if ok, err := s.Exists(ctx, "missing"); err != nil || ok {
		t.Errorf("Exists(missing) = %v, %v", ok, err)
	}
	if ok, err := s.Exists(ctx, "."); err != nil || !ok {
		t.Errorf("Exists(.) = %v, %v", ok, err)
	}
	if err := s.Delete(ctx, "dir/..", true); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, "run.sh", []byte("y"), WithFileMode(0o750)); err != nil {
		t.Fatal(err)
	}
	want := []seen{
		{"PUT", "/v1/files/dir%2Fa%20b%3F.txt", "", "application/octet-stream", "x"},
		{"GET", "/v1/files/dir%2Fa%20b%3F.txt", "", "", ""},
		{"GET", "/v1/files/dir", "", "", ""},
		{"GET", "/v1/files/plainfile", "", "", ""},
		{"GET", "/v1/files/dir", "", "", ""},
		{"HEAD", "/v1/files/missing", "", "", ""},
		{"HEAD", "/v1/files/%2E", "", "", ""},
		{"DELETE", "/v1/files/dir%2F%2E%2E", "recursive=true", "", ""},
		{"PUT", "/v1/files/run.sh", "mode=0750", "application/octet-stream", "y"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("requests:\n got %q\nwant %q", got, want)
	}
}

func TestSandboxdWithoutGRPCTargetIsNotReady(t *testing.T) {
	s := openTestSandbox(t, Options{Runtime: RuntimeSandboxd}, "http://127.0.0.1:1", false, nil)
	if _, err := s.Run(context.Background(), "true"); !errors.Is(err, ErrNotReady) {
		t.Fatalf("err = %v", err)
	}
}

// List of a file: sandboxd answers the file itself. The error is ErrNotADirectory, its bytes are neither read
// nor shown; nothing there is ErrNotADirectory too, as the legacy runtime's 404 for both. The file used to be
// downloaded (up to 32 MiB) and its start put in an untyped error.
func TestSandboxdListOfAFileIsErrNotADirectory(t *testing.T) {
	var written atomic.Int64
	done := make(chan struct{}, 1)
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "missing") {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"code":"NOT_FOUND","message":"path does not exist within the sandbox"}`)
			return
		}
		defer func() { done <- struct{}{} }()
		w.Header().Set("Content-Type", "application/octet-stream")
		chunk := bytes.Repeat([]byte("ABCDEFGHIJKLMNOPQRSTUVWXYZ"), 64<<10/26+1)[:64<<10]
		for i := 0; i < 1024; i++ { // 64 MiB
			n, err := w.Write(chunk)
			written.Add(int64(n))
			if err != nil {
				return
			}
		}
	})
	s := sandboxdTestSandbox(t, newFakeProcessService(), srv.URL)
	_, err := s.List(context.Background(), "big.txt")
	if !errors.Is(err, ErrNotADirectory) || strings.Contains(err.Error(), "ABCDEF") || !strings.HasPrefix(err.Error(), "sandbox[") {
		t.Fatalf("List(file) = %v; want ErrNotADirectory without the file's content", err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the server is still sending the file")
	}
	if written.Load() > 16<<20 {
		t.Errorf("%d MiB of the file were sent; want it left unread", written.Load()>>20)
	}
	_, err = s.List(context.Background(), "missing")
	var he *HTTPError
	if !errors.Is(err, ErrNotADirectory) || !errors.As(err, &he) || he.StatusCode != http.StatusNotFound {
		t.Fatalf("List(missing) = %v; want ErrNotADirectory with the 404", err)
	}
}

// A started Process's errors are the SDK's like any call's: prefixed "sandbox[ns/claim]:", a deadline is
// ErrTimeout (and context.DeadlineExceeded), a cancel context.Canceled. Recv used to return the bare gRPC
// error.
func TestSandboxdProcessErrorsAreTheSDKs(t *testing.T) {
	f := newFakeProcessService()
	s := sandboxdTestSandbox(t, f, "")
	recvAfterHello := func(p *Process) error {
		if ev, err := p.Recv(); err != nil || string(ev.Data) != "hello" {
			t.Fatalf("first event = %+v, %v", ev, err)
		}
		_, err := p.Recv()
		return err
	}
	p, err := s.Start(context.Background(), "cat", WithTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	err = recvAfterHello(p)
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) || !strings.HasPrefix(err.Error(), "sandbox[default/claim-1]: ") {
		t.Errorf("Recv past WithTimeout = %v; want sandbox[default/claim-1]: ... ErrTimeout", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p, err = s.Start(ctx, "cat")
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(100*time.Millisecond, cancel)
	err = recvAfterHello(p)
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrTimeout) || !strings.HasPrefix(err.Error(), "sandbox[default/claim-1]: ") {
		t.Errorf("Recv after cancel = %v; want sandbox[default/claim-1]: ... context.Canceled", err)
	}
	p, err = s.Start(context.Background(), "cat")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Signal(context.Background(), Signal(0)); err == nil || !strings.HasPrefix(err.Error(), "sandbox[default/claim-1]: ") {
		t.Errorf("refused Signal = %v; want the sandbox prefix", err)
	}
}

// A WithTimeout that is zero or negative is a deadline already past: the call fails at once with ErrTimeout
// and sends nothing. Until December 7 it was ignored (only a positive one applied) and the call ran under the
// 180 s RequestTimeout: a command ran, a file was written.
func TestWithTimeoutNotPositiveFailsAtOnceSendingNothing(t *testing.T) {
	var restCalls atomic.Int32
	rest := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		restCalls.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}).URL
	for _, d := range []time.Duration{0, -time.Nanosecond, -time.Hour} {
		f := newFakeProcessService()
		s := sandboxdTestSandbox(t, f, rest)
		if _, err := s.Run(context.Background(), "true", WithTimeout(d)); !errors.Is(err, ErrTimeout) {
			t.Errorf("Run with WithTimeout(%s): err = %v, want ErrTimeout", d, err)
		}
		if err := s.Write(context.Background(), "f.txt", []byte("x"), WithTimeout(d)); !errors.Is(err, ErrTimeout) {
			t.Errorf("Write with WithTimeout(%s): err = %v, want ErrTimeout", d, err)
		}
		f.mu.Lock()
		sent := len(f.execReqs)
		f.mu.Unlock()
		if sent != 0 || restCalls.Load() != 0 {
			t.Errorf("WithTimeout(%s): %d Execute and %d REST requests sent, want none", d, sent, restCalls.Load())
		}
	}
}
