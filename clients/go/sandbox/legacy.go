package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"mime/multipart"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// legacyRuntime speaks the python-runtime HTTP protocol (spec 2.1 and 4.7.5), plus this project's runtime
// extensions: env / cwd / timeout_seconds in /execute, NDJSON streaming at /execute/stream, and
// DELETE /files/{path}.
type legacyRuntime struct {
	http *httpCaller
	opts *Options
}

// executeBody is the JSON body of /execute and /execute/stream.
type executeBody struct {
	Command        string            `json:"command"`
	TimeoutSeconds float64           `json:"timeout_seconds,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	Cwd            string            `json:"cwd,omitempty"`
	// OutputEncoding "base64" (execute/stream only): chunks arrive as data_base64, the bytes exactly as
	// the command wrote them; a runtime that predates the field ignores it and sends UTF-8 text as data.
	OutputEncoding string `json:"output_encoding,omitempty"`
}

func newExecuteBody(command string, o *callOptions, outputEncoding string) ([]byte, error) {
	body := executeBody{Command: command, Env: o.env, Cwd: o.cwd, OutputEncoding: outputEncoding}
	if o.commandTimeout > 0 {
		body.TimeoutSeconds = o.commandTimeout.Seconds()
	}
	return json.Marshal(body)
}

// headerTimeoutFor is how long one attempt of a retried command call (WithMaxAttempts > 1) waits for response
// headers, and which limit that is: the legacy /execute answers only when the command ends, so a command
// timeout extends it (Python SDK: max(timeout, command_timeout + 10)). A call sent once waits as long as
// the call lasts (wireRequest.answerAtExit).
func headerTimeoutFor(opts *Options, o *callOptions) (time.Duration, string) {
	t, limit := opts.PerAttemptTimeout, "PerAttemptTimeout"
	if o.commandTimeout > 0 && o.commandTimeout+commandTimeoutSlack > t {
		t, limit = o.commandTimeout+commandTimeoutSlack, "WithCommandTimeout + 10s"
	}
	return t, limit
}

func (l *legacyRuntime) run(ctx context.Context, ep *endpoint, command string, o *callOptions) (*ExecutionResult, error) {
	body, err := newExecuteBody(command, o, "")
	if err != nil {
		return nil, err
	}
	headerTimeout, headerLimit := headerTimeoutFor(l.opts, o)
	resp, err := l.http.do(ctx, ep, wireRequest{
		op: "run", method: http.MethodPost, path: "execute", body: bytesBody(body),
		contentType: "application/json", maxAttempts: attemptsOr(o, defaultRunAttempts),
		headerTimeout: headerTimeout, headerLimit: headerLimit, answerAtExit: true,
	})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := readLimited(resp.Body, maxRunResponse, "run (POST execute)")
	if err != nil {
		return nil, err
	}
	var decoded struct {
		Stdout    string `json:"stdout"`
		Stderr    string `json:"stderr"`
		ExitCode  *int   `json:"exit_code"`
		TimedOut  bool   `json:"timed_out"`
		Truncated bool   `json:"truncated"`
	}
	if err := json.Unmarshal(raw, &decoded); err != nil {
		return nil, fmt.Errorf("run (POST execute): response is not the expected JSON: %w", err)
	}
	res := &ExecutionResult{Stdout: decoded.Stdout, Stderr: decoded.Stderr, ExitCode: -1,
		TimedOut: decoded.TimedOut, Truncated: decoded.Truncated}
	if decoded.ExitCode != nil {
		res.ExitCode = *decoded.ExitCode
	}
	return res, nil
}

func attemptsOr(o *callOptions, def int) int {
	if o.maxAttempts > 0 {
		return o.maxAttempts
	}
	return def
}

// start runs a command through POST /execute/stream (this project's runtime; upstream's python-runtime
// has no such route and answers 404, reported as ErrUnsupportedByRuntime).
func (l *legacyRuntime) start(ctx context.Context, ep *endpoint, command string, o *callOptions,
	release func()) (*Process, error) {
	if o.stdin != nil || o.pty != nil {
		return nil, fmt.Errorf("stdin and PTY need the sandboxd runtime: %w", ErrUnsupportedByRuntime)
	}
	body, err := newExecuteBody(command, o, "base64")
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	resp, err := l.http.do(sctx, ep, wireRequest{
		op: "start", method: http.MethodPost, path: "execute/stream", body: bytesBody(body),
		contentType: "application/json", maxAttempts: attemptsOr(o, defaultRunAttempts),
	})
	if err != nil {
		cancel()
		var he *HTTPError
		if errors.As(err, &he) && (he.StatusCode == http.StatusNotFound || he.StatusCode == http.StatusMethodNotAllowed) {
			return nil, fmt.Errorf("streaming execution (POST execute/stream) needs this project's runtime: %w: %w",
				ErrUnsupportedByRuntime, err)
		}
		return nil, err
	}
	b := &ndjsonProcess{body: resp.Body, lines: bufio.NewReaderSize(resp.Body, 64<<10), cancel: cancel}
	first, err := b.next()
	if err != nil {
		b.stop()
		return nil, err
	}
	id := 0
	if first.Type == "start" {
		id = first.Pid
	} else {
		b.pending = &first
	}
	return newProcess(id, b, release), nil
}

// streamLine is one NDJSON object of /execute/stream.
type streamLine struct {
	Type     string `json:"type"` // start | stdout | stderr | exit
	Pid      int    `json:"pid"`
	Data     string `json:"data"`
	Data64   []byte `json:"data_base64"` // encoding/json decodes base64 into []byte
	ExitCode *int   `json:"exit_code"`
	TimedOut bool   `json:"timed_out"`
}

// bytes is a chunk's output: data_base64 when the runtime sent it, else the UTF-8 text of data.
func (sl *streamLine) bytes() []byte {
	if sl.Data64 != nil {
		return sl.Data64
	}
	return []byte(sl.Data)
}

type ndjsonProcess struct {
	body    io.ReadCloser
	lines   *bufio.Reader
	cancel  context.CancelFunc
	pending *streamLine
}

const maxStreamLine = 16 << 20

func (n *ndjsonProcess) next() (streamLine, error) {
	var line []byte
	for {
		chunk, isPrefix, err := n.lines.ReadLine()
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				// Output may have arrived already: this is a cut, not a missing answer.
				return streamLine{}, fmt.Errorf("execute/stream: the stream ended before the command's exit "+
					"(%w): the sandbox went away, or a router or proxy in between closed it (a router's "+
					"--proxy-timeout is the longest silence it allows)", io.ErrUnexpectedEOF)
			}
			return streamLine{}, fmt.Errorf("execute/stream: %w", err)
		}
		line = append(line, chunk...)
		if len(line) > maxStreamLine {
			return streamLine{}, fmt.Errorf("execute/stream: %w (line over %d bytes)", ErrResponseTooLarge, maxStreamLine)
		}
		if isPrefix {
			continue
		}
		if len(bytes.TrimSpace(line)) == 0 {
			line = line[:0]
			continue
		}
		var sl streamLine
		if err := json.Unmarshal(line, &sl); err != nil {
			return streamLine{}, fmt.Errorf("execute/stream: malformed line %q: %w", truncate(string(line), 120), err)
		}
		return sl, nil
	}
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

func (n *ndjsonProcess) recv() (Event, error) {
	for {
		var sl streamLine
		if n.pending != nil {
			sl, n.pending = *n.pending, nil
		} else {
			var err error
			if sl, err = n.next(); err != nil {
				return Event{}, err
			}
		}
		switch sl.Type {
		case "stdout":
			return Event{Type: EventStdout, Data: sl.bytes()}, nil
		case "stderr":
			return Event{Type: EventStderr, Data: sl.bytes()}, nil
		case "exit":
			code := -1
			if sl.ExitCode != nil {
				code = *sl.ExitCode
			}
			return Event{Type: EventExit, ExitCode: code, TimedOut: sl.TimedOut}, nil
		}
		// "start" (again) or a type added later: skip
	}
}

func (n *ndjsonProcess) writeStdin(context.Context, []byte, bool) error {
	return fmt.Errorf("stdin needs the sandboxd runtime: %w", ErrUnsupportedByRuntime)
}

func (n *ndjsonProcess) signal(context.Context, Signal) error {
	return fmt.Errorf("signals need the sandboxd runtime (close the process to kill it): %w", ErrUnsupportedByRuntime)
}

func (n *ndjsonProcess) resize(context.Context, uint32, uint32) error {
	return fmt.Errorf("a PTY needs the sandboxd runtime: %w", ErrUnsupportedByRuntime)
}

func (n *ndjsonProcess) stop() {
	n.cancel()
	_ = n.body.Close()
}

// write streams an upload as multipart part "file" whose filename is the (sanitised) path.
func (l *legacyRuntime) write(ctx context.Context, ep *endpoint, path string, src *uploadSource, o *callOptions) error {
	clean, err := sanitizeFilePath(path)
	if err != nil {
		return err
	}
	boundary := multipart.NewWriter(io.Discard).Boundary()
	defer src.finish(ctx)
	form := func(w io.Writer, content io.Reader) error {
		mw := multipart.NewWriter(w)
		_ = mw.SetBoundary(boundary)
		part, err := mw.CreateFormFile("file", clean)
		if err != nil {
			return err
		}
		if _, err := io.Copy(part, content); err != nil {
			return err
		}
		return mw.Close()
	}
	var query url.Values
	if o.fileMode != nil { // this project's runtime sets it as it writes; upstream's ignores it (hence chmod)
		query = url.Values{"mode": {fmt.Sprintf("%04o", uint32(*o.fileMode))}}
	}
	resp, err := l.http.do(ctx, ep, wireRequest{
		op: "write", method: http.MethodPost, path: "upload", query: query, body: src.body(form),
		contentType: "multipart/form-data; boundary=" + boundary,
		maxAttempts: src.attempts(attemptsOr(o, defaultFileAttempts)),
	})
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if err := resp.Body.Close(); err != nil || o.fileMode == nil {
		return err
	}
	return l.chmod(ctx, ep, clean, *o.fileMode)
}

// chmod sets the mode an upload cannot carry, by a command run in the root the upload's path is relative to.
func (l *legacyRuntime) chmod(ctx context.Context, ep *endpoint, path string, perm fs.FileMode) error {
	mode := fmt.Sprintf("%04o", uint32(perm))
	res, err := l.run(ctx, ep, "chmod "+mode+" -- "+shellQuote(path), &callOptions{})
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("write %s: written, but setting its mode %s failed: %s", path, mode, strings.TrimSpace(res.Stderr))
	}
	return nil
}

// shellQuote quotes s as one word for a POSIX shell, and for the legacy runtime's shell-like split alike.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'"'"'`) + "'"
}

func (l *legacyRuntime) readTo(ctx context.Context, ep *endpoint, path string, w io.Writer, o *callOptions) (int64, error) {
	clean, err := sanitizeFilePath(path)
	if err != nil {
		return 0, err
	}
	p := "download/" + legacyPathParam(clean)
	resp, err := l.http.do(ctx, ep, wireRequest{
		op: "read", method: http.MethodGet, path: p, maxAttempts: attemptsOr(o, defaultFileAttempts),
	})
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	return copyLimited(ctx, ep, w, resp.Body, l.opts.MaxDownloadSize, "read (GET "+p+")")
}

func (l *legacyRuntime) list(ctx context.Context, ep *endpoint, path string, o *callOptions) ([]FileEntry, error) {
	p := "list/" + legacyPathParam(path)
	raw, err := l.getJSON(ctx, ep, "list", p, o)
	var he *HTTPError
	if errors.As(err, &he) && he.StatusCode == http.StatusNotFound && he.Body == "Path is not a directory" {
		// a file, or nothing there (the runtime does not say which): the kind sandboxd's answers get too
		return nil, fmt.Errorf("list %q: %w (a file, or nothing there): %w", path, ErrNotADirectory, err)
	}
	if err != nil {
		return nil, err
	}
	var entries []struct {
		Name    string   `json:"name"`
		Size    int64    `json:"size"`
		Type    FileType `json:"type"`
		ModTime float64  `json:"mod_time"`
		Mode    string   `json:"mode"` // this project's runtime adds it; upstream's lists none
	}
	if err := json.Unmarshal(raw, &entries); err != nil {
		return nil, fmt.Errorf("list (GET %s): response is not a JSON array of entries: %w", p, err)
	}
	out := make([]FileEntry, 0, len(entries))
	for _, e := range entries {
		out = append(out, FileEntry{Name: e.Name, Size: e.Size, Type: e.Type, ModTime: epochToTime(e.ModTime), Mode: e.Mode})
	}
	return out, nil
}

func epochToTime(sec float64) time.Time {
	whole, frac := math.Modf(sec)
	return time.Unix(int64(whole), int64(frac*1e9)).UTC()
}

func (l *legacyRuntime) exists(ctx context.Context, ep *endpoint, path string, o *callOptions) (bool, error) {
	p := "exists/" + legacyPathParam(path)
	raw, err := l.getJSON(ctx, ep, "exists", p, o)
	if err != nil {
		return false, err
	}
	var decoded struct {
		Exists *bool `json:"exists"`
	}
	if err := json.Unmarshal(raw, &decoded); err != nil || decoded.Exists == nil {
		return false, fmt.Errorf("exists (GET %s): response has no boolean \"exists\": %s", p, truncate(string(raw), 120))
	}
	return *decoded.Exists, nil
}

func (l *legacyRuntime) getJSON(ctx context.Context, ep *endpoint, op, p string, o *callOptions) ([]byte, error) {
	resp, err := l.http.do(ctx, ep, wireRequest{
		op: op, method: http.MethodGet, path: p, maxAttempts: attemptsOr(o, defaultFileAttempts),
	})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return readLimited(resp.Body, maxListResponse, op+" (GET "+p+")")
}

// delete uses this project's DELETE /files/{path} extension (upstream's python-runtime has none: its 404 /
// 405 for the route is reported as ErrUnsupportedByRuntime).
func (l *legacyRuntime) delete(ctx context.Context, ep *endpoint, path string, recursive bool, o *callOptions) error {
	if path == "" {
		return invalidf("path must not be empty")
	}
	p := "files/" + legacyPathParam(path)
	var q url.Values
	if recursive {
		q = url.Values{"recursive": {"true"}}
	}
	resp, err := l.http.do(ctx, ep, wireRequest{
		op: "delete", method: http.MethodDelete, path: p, query: q, maxAttempts: attemptsOr(o, defaultFileAttempts),
	})
	if err != nil {
		var he *HTTPError
		if errors.As(err, &he) && (he.StatusCode == http.StatusMethodNotAllowed ||
			(he.StatusCode == http.StatusNotFound && he.Body == "Not Found")) {
			return fmt.Errorf("delete needs this project's runtime or sandboxd: %w: %w", ErrUnsupportedByRuntime, err)
		}
		return err
	}
	return resp.Body.Close()
}
