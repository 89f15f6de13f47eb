package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	processv1 "agent-sandbox.invalid/clients/go/internal/processv1"
)

// sandboxdRuntime speaks sandboxd (spec 2.2): REST files under v1/files/ and gRPC process.v1 for commands.
type sandboxdRuntime struct {
	http *httpCaller
	opts *Options
}

// truncationMarkerRE is the line this project's runtime ends an output it cut with (runtime/processes.py
// BoundedOutput: "\n[output truncated: N more bytes]\n"). process.v1's ExecuteResponse has no field for it,
// so a sandboxd Run reads the marker: until December 6 its Truncated was always false, the legacy
// runtime's true. Upstream's sandboxd does not cut output (no marker, Truncated stays false).
var truncationMarkerRE = regexp.MustCompile(`\n\[output truncated: [0-9]+ more bytes\]\n\z`)

func truncatedByRuntime(output []byte) bool { return truncationMarkerRE.Match(output) }

// shellArgv is how both SDKs run a command string on sandboxd (which has no implicit shell).
func shellArgv(command string) []string { return []string{"/bin/sh", "-c", command} }

func processConfig(command string, o *callOptions) *processv1.ProcessConfig {
	cfg := &processv1.ProcessConfig{Command: shellArgv(command), EnvVars: o.env}
	if o.cwd != "" {
		cfg.Cwd = &o.cwd
	}
	return cfg
}

// grpcError describes a failed process.v1 call (the status stays reachable with status.FromError).
func grpcError(op string, err error) error {
	st, _ := status.FromError(err)
	return fmt.Errorf("%s: sandboxd process service failed (%s): %w", op, st.Code(), err)
}

// timedOutResult is what a command killed by WithCommandTimeout reports (Python SDK 1.0.8 shape).
func timedOutResult(d time.Duration) *ExecutionResult {
	return &ExecutionResult{
		Stderr: fmt.Sprintf("Command timed out after %s seconds", formatSeconds(d)), ExitCode: 124, TimedOut: true,
	}
}

func formatSeconds(d time.Duration) string {
	return fmt.Sprintf("%g", d.Seconds())
}

// unavailable returns the named cause of a gRPC UNAVAILABLE (the router's 502, or no connection to the pod)
// when the Sandbox tells one (ErrSandboxDeleted, ErrNotReady; see endpoint.whyUnreachable), wrapping err;
// else nil. In pod-IP mode a deleted sandbox's Run and Start used to fail "Unavailable ... connection
// refused" matching no sentinel. Through a router only its "could not connect" answer reads the Sandbox:
// a router that cannot be reached (restarting), its overload answer and a lifecycle router's 503 (which
// says why itself) say nothing of the sandbox - until December 6 each of them cost a Sandbox read.
func unavailable(ctx context.Context, ep *endpoint, d *diagnosis, err, cause error) error {
	if status.Code(cause) != codes.Unavailable || ep == nil {
		return nil
	}
	if ep.viaRouter() && !routerCouldNotConnect(cause) {
		return nil
	}
	if gone := ep.whyUnreachable(ctx, d); gone != nil {
		return fmt.Errorf("%w; %w", err, gone)
	}
	return nil
}

// routerCouldNotConnect: a gRPC status that is a router's 502 for the sandbox (ours as grpc-message
// "Could not connect to the backend sandbox: <id>"; a router that answers gRPC with an HTTP 502 - upstream's
// - as grpc-go's "unexpected HTTP status code received from server: 502").
func routerCouldNotConnect(cause error) bool {
	msg := status.Convert(cause).Message()
	return strings.Contains(msg, "Could not connect to the backend sandbox") ||
		strings.Contains(msg, "status code received from server: 502")
}

func (s *sandboxdRuntime) run(ctx context.Context, client processv1.ProcessServiceClient, ep *endpoint, command string,
	o *callOptions) (*ExecutionResult, error) {
	req := &processv1.ExecuteRequest{Config: processConfig(command, o)}
	attempts := attemptsOr(o, defaultRunAttempts)
	var last error
	var diag diagnosis
	for n := 1; n <= attempts; n++ {
		if n > 1 {
			if err := s.http.sleep(ctx, backoff(n, s.http.jitter())); err != nil {
				return nil, callContextError(ctx, "run (process.v1 Execute)", diag.final(last))
			}
		}
		cctx, cancel := ctx, context.CancelFunc(func() {})
		if o.commandTimeout > 0 {
			cctx, cancel = context.WithTimeout(ctx, o.commandTimeout)
		}
		resp, err := client.Execute(cctx, req)
		// the server may report the propagated deadline before the client's own timer fires
		commandTimedOut := o.commandTimeout > 0 && ctx.Err() == nil &&
			(cctx.Err() != nil || status.Code(err) == codes.DeadlineExceeded)
		cancel()
		if err == nil {
			return &ExecutionResult{
				Stdout: string(resp.GetStdout()), Stderr: string(resp.GetStderr()), ExitCode: int(resp.GetExitCode()),
				Truncated: truncatedByRuntime(resp.GetStdout()) || truncatedByRuntime(resp.GetStderr()),
			}, nil
		}
		if commandTimedOut {
			return timedOutResult(o.commandTimeout), nil
		}
		if ctx.Err() != nil {
			return nil, callContextError(ctx, "run (process.v1 Execute)", err)
		}
		if status.Code(err) == codes.DeadlineExceeded {
			// the call's own deadline, reported by the server a moment before the client notices it
			return nil, fmt.Errorf("run (process.v1 Execute): %w (%w): %w", ErrTimeout, context.DeadlineExceeded, err)
		}
		last = grpcError("run (process.v1 Execute)", err)
		if status.Code(err) != codes.Unavailable {
			return nil, last
		}
		if named := unavailable(ctx, ep, &diag, last, err); named != nil {
			return nil, named // gone or suspended: no further attempt reaches it
		}
	}
	if attempts == 1 {
		return nil, diag.final(last)
	}
	return nil, diag.final(fmt.Errorf("%w after %d attempts: %w", ErrRetriesExhausted, attempts, last))
}

// start opens a process.v1 Start stream. The first event must be init (the process id); a command
// timeout is enforced client side by ending the stream (which kills the process) and reported as a
// TimedOut exit with code 124.
func (s *sandboxdRuntime) start(ctx context.Context, client processv1.ProcessServiceClient, ep *endpoint,
	command string, o *callOptions, release func()) (*Process, error) {
	req := &processv1.StartRequest{Config: processConfig(command, o)}
	if o.pty != nil {
		req.Pty = &processv1.PTY{Cols: o.pty.cols, Rows: o.pty.rows}
	}
	sctx, cancel := context.WithCancel(ctx)
	b := &grpcProcess{client: client, cancel: cancel, commandTimeout: o.commandTimeout}
	failed := func(err error) error {
		cancel()
		out := grpcError("start (process.v1 Start)", err)
		var diag diagnosis
		if ctx.Err() == nil {
			if named := unavailable(ctx, ep, &diag, out, err); named != nil {
				return named
			}
		}
		return diag.final(out)
	}
	stream, err := client.Start(sctx, req)
	if err != nil {
		return nil, failed(err)
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, failed(err)
	}
	init := first.GetInit()
	if init == nil {
		cancel()
		return nil, fmt.Errorf("start (process.v1 Start): first event is %T, not init", first.GetEvent())
	}
	b.stream = stream
	b.id = init.GetProcessId()
	if o.commandTimeout > 0 {
		b.timer = time.AfterFunc(o.commandTimeout, func() { b.timedOut.Store(true); cancel() })
	}
	return newProcess(int(b.id), b, release), nil
}

type grpcProcess struct {
	client         processv1.ProcessServiceClient
	stream         grpc.ServerStreamingClient[processv1.StartResponse]
	cancel         context.CancelFunc
	id             int32
	commandTimeout time.Duration
	timer          *time.Timer
	timedOut       atomic.Bool
	stopOnce       sync.Once
}

func (g *grpcProcess) recv() (Event, error) {
	for {
		msg, err := g.stream.Recv()
		if err != nil {
			if g.timedOut.Load() {
				return Event{Type: EventExit, ExitCode: 124, TimedOut: true}, nil
			}
			if errors.Is(err, io.EOF) {
				return Event{}, fmt.Errorf("process %d: stream ended without an exit event: %w", g.id, io.ErrUnexpectedEOF)
			}
			return Event{}, grpcError(fmt.Sprintf("process %d", g.id), err)
		}
		switch ev := msg.GetEvent().(type) {
		case *processv1.StartResponse_Stdout:
			return Event{Type: EventStdout, Data: ev.Stdout}, nil
		case *processv1.StartResponse_Stderr:
			return Event{Type: EventStderr, Data: ev.Stderr}, nil
		case *processv1.StartResponse_Exit:
			return Event{Type: EventExit, ExitCode: int(ev.Exit.GetExitCode())}, nil
		}
		// a second init or an event added later: skip
	}
}

func (g *grpcProcess) writeStdin(ctx context.Context, data []byte, eof bool) error {
	req := &processv1.WriteStdinRequest{ProcessId: g.id}
	if eof {
		req.Payload = &processv1.WriteStdinRequest_Eof{Eof: &emptypb.Empty{}}
	} else {
		req.Payload = &processv1.WriteStdinRequest_Input{Input: data}
	}
	if _, err := g.client.WriteStdin(ctx, req); err != nil {
		return grpcError(fmt.Sprintf("process %d: write stdin", g.id), err)
	}
	return nil
}

func (g *grpcProcess) signal(ctx context.Context, sig Signal) error {
	_, err := g.client.SendSignal(ctx, &processv1.SendSignalRequest{ProcessId: g.id, Signal: processv1.Signal(sig)})
	if err != nil {
		return grpcError(fmt.Sprintf("process %d: signal %d", g.id, sig), err)
	}
	return nil
}

func (g *grpcProcess) resize(ctx context.Context, cols, rows uint32) error {
	_, err := g.client.ResizeTTY(ctx, &processv1.ResizeTTYRequest{ProcessId: g.id, Cols: cols, Rows: rows})
	if err != nil {
		return grpcError(fmt.Sprintf("process %d: resize tty", g.id), err)
	}
	return nil
}

func (g *grpcProcess) stop() {
	g.stopOnce.Do(func() {
		if g.timer != nil {
			g.timer.Stop()
		}
		g.cancel()
	})
}

// --- REST files (spec 2.2.1) ---

func filesPath(p string) string { return "v1/files/" + sandboxdPathParam(p) }

func (s *sandboxdRuntime) write(ctx context.Context, ep *endpoint, path string, src *uploadSource, o *callOptions) error {
	clean, err := sanitizeFilePath(path)
	if err != nil {
		return err
	}
	if err := checkSandboxdWritePath(path); err != nil {
		return err
	}
	var query url.Values
	if o.fileMode != nil {
		query = url.Values{"mode": {fmt.Sprintf("%04o", uint32(*o.fileMode))}}
	}
	defer src.finish(ctx)
	raw := func(w io.Writer, content io.Reader) error { _, err := io.Copy(w, content); return err }
	resp, err := s.http.do(ctx, ep, wireRequest{
		op: "write", method: http.MethodPut, path: filesPath(clean), query: query, body: src.body(raw),
		contentType: "application/octet-stream", maxAttempts: src.attempts(attemptsOr(o, defaultFileAttempts)),
	})
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

func (s *sandboxdRuntime) readTo(ctx context.Context, ep *endpoint, path string, w io.Writer, o *callOptions) (int64, error) {
	clean, err := sanitizeFilePath(path)
	if err != nil {
		return 0, err
	}
	p := filesPath(clean)
	resp, err := s.http.do(ctx, ep, wireRequest{
		op: "read", method: http.MethodGet, path: p, maxAttempts: attemptsOr(o, defaultFileAttempts),
	})
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	// sandboxd answers a GET of a directory with its JSON listing (a file is always application/octet-stream);
	// those bytes are not the file asked for
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		return 0, fmt.Errorf("read (GET %s): %s is a directory, not a file (List lists it)", p, clean)
	}
	return copyLimited(ctx, ep, w, resp.Body, s.opts.MaxDownloadSize, "read (GET "+p+")")
}

func (s *sandboxdRuntime) list(ctx context.Context, ep *endpoint, path string, o *callOptions) ([]FileEntry, error) {
	p := filesPath(path)
	resp, err := s.http.do(ctx, ep, wireRequest{
		op: "list", method: http.MethodGet, path: p, maxAttempts: attemptsOr(o, defaultFileAttempts),
	})
	var he *HTTPError
	if errors.As(err, &he) && he.StatusCode == http.StatusNotFound && strings.HasPrefix(he.Body, "NOT_FOUND:") {
		// nothing there: the same kind as the legacy runtime's 404 "Path is not a directory"
		return nil, fmt.Errorf("list %q: %w (nothing there): %w", path, ErrNotADirectory, err)
	}
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	// sandboxd answers a GET of a file with the file (application/octet-stream; a listing is JSON). Its bytes
	// are not read: until December 6 up to 32 MiB of them were downloaded and their start put in an untyped
	// error message.
	ct := resp.Header.Get("Content-Type")
	if strings.HasPrefix(ct, "application/octet-stream") {
		return nil, fmt.Errorf("list (GET %s): %q is a file: %w", p, path, ErrNotADirectory)
	}
	if ct != "" && !strings.HasPrefix(ct, "application/json") {
		return nil, fmt.Errorf("list (GET %s): response is not a directory listing (Content-Type %q)", p, ct)
	}
	raw, err := readLimited(resp.Body, maxListResponse, "list (GET "+p+")")
	if err != nil {
		return nil, err
	}
	var listing struct {
		Entries *[]struct {
			Name       string   `json:"name"`
			Size       int64    `json:"size"`
			Type       FileType `json:"type"`
			ModifiedAt string   `json:"modified_at"`
			Mode       string   `json:"mode"`
		} `json:"entries"`
	}
	if err := json.Unmarshal(raw, &listing); err != nil || listing.Entries == nil {
		// no excerpt of the body: it could be a file's content
		return nil, fmt.Errorf("list (GET %s): response is not a directory listing (%d bytes of %q)", p, len(raw), ct)
	}
	out := make([]FileEntry, 0, len(*listing.Entries))
	for _, e := range *listing.Entries {
		if e.Type != FileTypeFile && e.Type != FileTypeDirectory {
			continue
		}
		mod, err := parseTime(e.ModifiedAt)
		if err != nil {
			return nil, fmt.Errorf("list (GET %s): entry %q has modified_at %q: %w", p, e.Name, e.ModifiedAt, err)
		}
		out = append(out, FileEntry{Name: e.Name, Size: e.Size, Type: e.Type, ModTime: mod.UTC(), Mode: e.Mode})
	}
	return out, nil
}

func (s *sandboxdRuntime) exists(ctx context.Context, ep *endpoint, path string, o *callOptions) (bool, error) {
	resp, err := s.http.do(ctx, ep, wireRequest{
		op: "exists", method: http.MethodHead, path: filesPath(path), maxAttempts: attemptsOr(o, defaultFileAttempts),
		accept: func(code int) bool { return code == http.StatusNotFound },
	})
	if err != nil {
		return false, err
	}
	_ = resp.Body.Close()
	return resp.StatusCode != http.StatusNotFound, nil
}

func (s *sandboxdRuntime) delete(ctx context.Context, ep *endpoint, path string, recursive bool, o *callOptions) error {
	if path == "" {
		return invalidf("path must not be empty")
	}
	var q url.Values
	if recursive {
		q = url.Values{"recursive": {"true"}}
	}
	resp, err := s.http.do(ctx, ep, wireRequest{
		op: "delete", method: http.MethodDelete, path: filesPath(path), query: q,
		maxAttempts: attemptsOr(o, defaultFileAttempts),
	})
	if err != nil {
		return err
	}
	return resp.Body.Close()
}
