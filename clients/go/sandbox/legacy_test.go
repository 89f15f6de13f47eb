package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestLegacyRunSendsCommandAndOptions(t *testing.T) {
	var body map[string]any
	var path, ctype string
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		path, ctype = r.URL.Path, r.Header.Get("Content-Type")
		_ = json.NewDecoder(r.Body).Decode(&body)
		_, _ = io.WriteString(w, `{"stdout":"hi\n","stderr":"","exit_code":0,"timed_out":false}`)
	})
	s := openTestSandbox(t, Options{}, srv.URL+"/prefix", true, nil)
	res, err := s.Run(context.Background(), "echo hi", WithEnv(map[string]string{"A": "1"}), WithCwd("work"),
		WithCommandTimeout(1500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if *res != (ExecutionResult{Stdout: "hi\n", ExitCode: 0}) {
		t.Errorf("result = %+v", res)
	}
	if path != "/prefix/execute" || ctype != "application/json" {
		t.Errorf("path %q content-type %q", path, ctype)
	}
	want := map[string]any{"command": "echo hi", "env": map[string]any{"A": "1"}, "cwd": "work", "timeout_seconds": 1.5}
	if fmt.Sprint(body) != fmt.Sprint(want) {
		t.Errorf("body = %v, want %v", body, want)
	}
}

func TestLegacyRunPlainBodyAndMissingExitCode(t *testing.T) {
	var raw string
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		raw = string(b)
		_, _ = io.WriteString(w, `{"stdout":"x"}`)
	})
	s := openTestSandbox(t, Options{}, srv.URL, true, nil)
	res, err := s.Run(context.Background(), "true")
	if err != nil {
		t.Fatal(err)
	}
	if raw != `{"command":"true"}` {
		t.Errorf("body = %s, want only the command (upstream shape)", raw)
	}
	if res.ExitCode != -1 || res.Stdout != "x" {
		t.Errorf("result = %+v", res)
	}
}

func TestLegacyRunRejectsBadAnswers(t *testing.T) {
	for name, answer := range map[string]string{
		"not json": "<html>", "too large": `{"stdout":"` + strings.Repeat("a", maxRunResponse) + `"}`,
	} {
		t.Run(name, func(t *testing.T) {
			srv := newServer(t, func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, answer) })
			s := openTestSandbox(t, Options{}, srv.URL, true, nil)
			_, err := s.Run(context.Background(), "true")
			if err == nil {
				t.Fatal("no error")
			}
			if name == "too large" && !errors.Is(err, ErrResponseTooLarge) {
				t.Errorf("err = %v", err)
			}
		})
	}
}

func TestLegacyStreamingEventsInOrder(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/execute/stream" {
			http.NotFound(w, r)
			return
		}
		if v := r.Header.Get("X-Sandbox-Timeout"); v != "" {
			t.Errorf("a stream without a deadline sent X-Sandbox-Timeout %q (the router would cut it)", v)
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		f := w.(http.Flusher)
		for _, line := range []string{
			`{"type":"start","pid":42}`, `{"type":"stdout","data":"one\n"}`, `{"type":"stderr","data":"warn\n"}`,
			`{"type":"stdout","data":"two\n"}`, `{"type":"exit","exit_code":3,"timed_out":false}`,
		} {
			_, _ = io.WriteString(w, line+"\n")
			f.Flush()
		}
	})
	s := openTestSandbox(t, Options{}, srv.URL, true, nil)
	p, err := s.Start(context.Background(), "prog")
	if err != nil {
		t.Fatal(err)
	}
	if p.ID() != 42 {
		t.Errorf("ID = %d", p.ID())
	}
	var seen []string
	for ev, err := range p.Events() {
		if err != nil {
			t.Fatal(err)
		}
		seen = append(seen, fmt.Sprintf("%s:%s%d", ev.Type, ev.Data, ev.ExitCode))
	}
	if _, err := p.Recv(); !errors.Is(err, io.EOF) {
		t.Errorf("Recv after the exit event: %v", err)
	}
	want := []string{"stdout:one\n0", "stderr:warn\n0", "stdout:two\n0", "exit:3"}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Errorf("events = %q, want %q", seen, want)
	}
	if err := p.Signal(context.Background(), SignalInterrupt); !errors.Is(err, ErrUnsupportedByRuntime) {
		t.Errorf("Signal on legacy = %v", err)
	}
	if s.inflight != 0 {
		t.Errorf("in-flight = %d after the exit event", s.inflight)
	}
}

func TestLegacyRunWithWritersStreams(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"type":"start","pid":1}`+"\n"+`{"type":"stdout","data":"a"}`+"\n"+
			`{"type":"stderr","data":"b"}`+"\n"+`{"type":"exit","exit_code":124,"timed_out":true}`+"\n")
	})
	s := openTestSandbox(t, Options{}, srv.URL, true, nil)
	var out strings.Builder
	res, err := s.Run(context.Background(), "x", WithStdout(&out))
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != "a" || res.Stdout != "" || res.Stderr != "b" || res.ExitCode != 124 || !res.TimedOut {
		t.Errorf("out %q result %+v", out.String(), res)
	}
}

func TestLegacyStreamingOnUpstreamRuntimeIsUnsupported(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"detail":"Not Found"}`)
	})
	s := openTestSandbox(t, Options{}, srv.URL, true, nil)
	if _, err := s.Start(context.Background(), "x"); !errors.Is(err, ErrUnsupportedByRuntime) {
		t.Fatalf("err = %v", err)
	}
	if _, err := s.Run(context.Background(), "x", WithStdin(strings.NewReader("in"))); !errors.Is(err, ErrUnsupportedByRuntime) {
		t.Fatalf("stdin on legacy: err = %v", err)
	}
	if err := s.Delete(context.Background(), "f", false); !errors.Is(err, ErrUnsupportedByRuntime) {
		t.Fatalf("delete on upstream legacy: err = %v", err)
	}
}

func TestLegacyFileWire(t *testing.T) {
	type seen struct{ method, rawPath, query, filename, content string }
	var got []seen
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		s := seen{method: r.Method, rawPath: r.URL.EscapedPath(), query: r.URL.RawQuery}
		if r.Method == http.MethodPost {
			mr, err := r.MultipartReader()
			if err != nil {
				t.Errorf("multipart: %v", err)
				return
			}
			part, err := mr.NextPart()
			if err != nil || part.FormName() != "file" {
				t.Errorf("part: %v %q", err, part.FormName())
				return
			}
			b, _ := io.ReadAll(part)
			// the raw header: Part.FileName() would strip the directories
			s.filename, s.content = part.Header.Get("Content-Disposition"), string(b)
		}
		got = append(got, s)
		switch {
		case strings.HasPrefix(r.URL.Path, "/list/"):
			_, _ = io.WriteString(w, `[{"name":"a b","size":3,"type":"file","mod_time":1700000000.5}]`)
		case strings.HasPrefix(r.URL.Path, "/exists/"):
			_, _ = io.WriteString(w, `{"path":"x","exists":true}`)
		case strings.HasPrefix(r.URL.Path, "/download/"):
			_, _ = io.WriteString(w, "bytes")
		default:
			_, _ = io.WriteString(w, `{"message":"ok"}`)
		}
	})
	s := openTestSandbox(t, Options{}, srv.URL, true, nil)
	ctx := context.Background()
	if err := s.Write(ctx, "/dir/a b.txt", []byte("hi")); err != nil {
		t.Fatal(err)
	}
	if b, err := s.Read(ctx, "dir/a b.txt"); err != nil || string(b) != "bytes" {
		t.Fatal(b, err)
	}
	entries, err := s.List(ctx, "dir/sub")
	if err != nil {
		t.Fatal(err)
	}
	wantTime := time.Unix(1700000000, 500000000).UTC()
	if len(entries) != 1 || entries[0].Name != "a b" || !entries[0].ModTime.Equal(wantTime) || entries[0].Type != FileTypeFile {
		t.Errorf("entries = %+v", entries)
	}
	if ok, err := s.Exists(ctx, ".."); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if err := s.Delete(ctx, "dir", true); err != nil {
		t.Fatal(err)
	}
	want := []seen{
		{method: "POST", rawPath: "/upload", filename: `form-data; name="file"; filename="dir/a b.txt"`, content: "hi"},
		{method: "GET", rawPath: "/download/dir%2Fa%20b.txt"},
		{method: "GET", rawPath: "/list/dir%2Fsub"},
		{method: "GET", rawPath: "/exists/%2E%2E"},
		{method: "DELETE", rawPath: "/files/dir", query: "recursive=true"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("requests:\n got %+v\nwant %+v", got, want)
	}
}

func TestReadRespectsMaxDownloadSize(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "0123456789") })
	s := openTestSandbox(t, Options{MaxDownloadSize: 5}, srv.URL, true, nil)
	if _, err := s.Read(context.Background(), "f"); !errors.Is(err, ErrResponseTooLarge) {
		t.Fatalf("err = %v", err)
	}
	s2 := openTestSandbox(t, Options{MaxUploadSize: 1}, srv.URL, true, nil)
	if err := s2.Write(context.Background(), "f", []byte("ab")); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("write over MaxUploadSize: %v", err)
	}
}

func TestExecOptionsOnFileCallsAreRejected(t *testing.T) {
	s := openTestSandbox(t, Options{}, "http://127.0.0.1:1", true, nil)
	_, err := s.Read(context.Background(), "f", WithEnv(map[string]string{"A": "1"}))
	if !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("err = %v", err)
	}
	_, err = s.Run(context.Background(), "x", WithEnv(map[string]string{"A=B": "1"}))
	if !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("env key with '=': %v", err)
	}
}

func TestStreamedRunDeadlineIsErrTimeout(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"type":"start","pid":1}`+"\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	s := openTestSandbox(t, Options{}, srv.URL, true, nil)
	_, err := s.Run(context.Background(), "sleep 100", WithStdout(io.Discard), WithTimeout(200*time.Millisecond))
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v", err)
	}
}

func TestLegacyStreamingAsksForAndDecodesRawBytes(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body["output_encoding"] != "base64" {
			t.Errorf("stream request body %v (%v): want output_encoding base64", body, err)
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		// not UTF-8, then a NUL, then text from a runtime that ignores the field
		_, _ = io.WriteString(w, `{"type":"start","pid":1}`+"\n"+`{"type":"stdout","data_base64":"//4A"}`+"\n"+
			`{"type":"stdout","data":"é"}`+"\n"+`{"type":"stderr","data_base64":"AA=="}`+"\n"+
			`{"type":"exit","exit_code":0}`+"\n")
	})
	s := openTestSandbox(t, Options{}, srv.URL, true, nil)
	p, err := s.Start(context.Background(), "prog")
	if err != nil {
		t.Fatal(err)
	}
	res, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if res.Stdout != "\xff\xfe\x00é" || res.Stderr != "\x00" {
		t.Errorf("stdout %q stderr %q", res.Stdout, res.Stderr)
	}
}

func TestLegacyStreamingRefusesBadBase64(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"type":"start","pid":1}`+"\n"+`{"type":"stdout","data_base64":"%%%"}`+"\n")
	})
	s := openTestSandbox(t, Options{}, srv.URL, true, nil)
	p, err := s.Start(context.Background(), "prog")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(); err == nil || !strings.Contains(err.Error(), "malformed line") {
		t.Errorf("Wait = %v, want a malformed-line error", err)
	}
}

func TestLegacyWriteWithFileModeRunsChmodAfterTheUpload(t *testing.T) {
	var commands, uploadModes []string
	exit := 0
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/upload":
			uploadModes = append(uploadModes, r.URL.Query().Get("mode"))
			_, _ = io.WriteString(w, `{"message":"ok"}`)
		case "/execute":
			var body struct{ Command string }
			_ = json.NewDecoder(r.Body).Decode(&body)
			commands = append(commands, body.Command)
			_, _ = fmt.Fprintf(w, `{"stdout":"","stderr":"chmod: denied\n","exit_code":%d}`, exit)
		case "/list/dir":
			_, _ = io.WriteString(w, `[{"name":"run.sh","size":3,"type":"file","mod_time":1,"mode":"0755"}]`)
		default:
			_, _ = io.WriteString(w, `{"message":"ok"}`)
		}
	})
	s := openTestSandbox(t, Options{}, srv.URL, true, nil)
	ctx := context.Background()
	if err := s.Write(ctx, "/bin dir/it's.sh", []byte("x"), WithFileMode(0o755)); err != nil {
		t.Fatal(err)
	}
	if want := []string{`chmod 0755 -- 'bin dir/it'"'"'s.sh'`}; fmt.Sprint(commands) != fmt.Sprint(want) {
		t.Errorf("commands = %q, want %q", commands, want)
	}
	if fmt.Sprint(uploadModes) != "[0755]" { // this project's runtime sets it as it writes
		t.Errorf("upload ?mode= = %q", uploadModes)
	}
	if entries, err := s.List(ctx, "dir"); err != nil || len(entries) != 1 || entries[0].Mode != "0755" {
		t.Errorf("List = %+v, %v (the mode this project's legacy runtime lists)", entries, err)
	}
	exit = 1
	if err := s.Write(ctx, "f", []byte("x"), WithFileMode(0o700)); err == nil || !strings.Contains(err.Error(), "setting its mode 0700 failed: chmod: denied") {
		t.Errorf("failed chmod: %v", err)
	}
	for _, call := range []func() error{
		func() error { return s.Write(ctx, "f", nil, WithFileMode(fs.ModeSetuid|0o755)) },
		func() error { _, err := s.Read(ctx, "f", WithFileMode(0o644)); return err },
	} {
		if err := call(); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("err = %v, want ErrInvalidArgument", err)
		}
	}
}

// A stream cut before the exit event (a router's idle limit, a pod going away) says so after the output it
// carried; the runtime's keep-alive blank lines in between are skipped.
func TestLegacyStreamCutBeforeExitSaysSo(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/execute/stream" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = io.WriteString(w, "{\"type\":\"start\",\"pid\":1}\n\n{\"type\":\"stdout\",\"data\":\"half\"}\n\n")
		w.(http.Flusher).Flush()
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close() // mid-body: no terminating chunk
		}
	})
	s := openTestSandbox(t, Options{}, srv.URL, true, nil)
	p, err := s.Start(context.Background(), "prog")
	if err != nil {
		t.Fatal(err)
	}
	ev, err := p.Recv()
	if err != nil || ev.Type != EventStdout || string(ev.Data) != "half" {
		t.Fatalf("first event = %+v, %v", ev, err)
	}
	_, err = p.Recv()
	if !errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(err.Error(), "ended before the command's exit") ||
		!strings.Contains(err.Error(), "--proxy-timeout") {
		t.Fatalf("Recv after the cut = %v", err)
	}
}

// A directory listing past the SDK's limit says what to do instead; one of 100,000 entries (~9 MB, refused by
// the 8 MiB limit until December 5) is read.
func TestLegacyListLimit(t *testing.T) {
	entry := `{"name":"f000000.txt","size":0,"type":"file","mod_time":1764970000.123456},`
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		n := 100000
		if r.URL.Path == "/list/huge" {
			n = (maxListResponse / len(entry)) + 10
		}
		_, _ = io.WriteString(w, "["+strings.Repeat(entry, n-1)+strings.TrimSuffix(entry, ",")+"]")
	})
	s := openTestSandbox(t, Options{}, srv.URL, true, nil)
	got, err := s.List(context.Background(), "many")
	if err != nil || len(got) != 100000 {
		t.Fatalf("List(many) = %d entries, %v", len(got), err)
	}
	_, err = s.List(context.Background(), "huge")
	if !errors.Is(err, ErrResponseTooLarge) || !strings.Contains(err.Error(), "`ls DIR | wc -l`") {
		t.Fatalf("List(huge) = %v", err)
	}
}

// The legacy runtime answers List of a file (or of nothing) with 404 "Path is not a directory": the same
// ErrNotADirectory as sandboxd, the 404 kept.
func TestLegacyListOfAFileIsErrNotADirectory(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"message": "Path is not a directory"}`)
	})
	s := openTestSandbox(t, Options{}, srv.URL, true, nil)
	_, err := s.List(context.Background(), "a.txt")
	var he *HTTPError
	if !errors.Is(err, ErrNotADirectory) || !errors.As(err, &he) || he.StatusCode != http.StatusNotFound {
		t.Fatalf("List(file) = %v; want ErrNotADirectory with the 404", err)
	}
}

// A legacy stream past its deadline: Recv's error is ErrTimeout with the sandbox prefix, as every call's.
func TestLegacyProcessDeadlineIsErrTimeout(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = io.WriteString(w, "{\"type\":\"start\",\"pid\":1}\n{\"type\":\"stdout\",\"data\":\"half\"}\n")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	})
	s := openTestSandbox(t, Options{}, srv.URL, true, nil)
	p, err := s.Start(context.Background(), "prog", WithTimeout(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := p.Recv(); err != nil || string(ev.Data) != "half" {
		t.Fatalf("first event = %+v, %v", ev, err)
	}
	_, err = p.Recv()
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) || !strings.HasPrefix(err.Error(), "sandbox[default/claim-1]: ") {
		t.Fatalf("Recv past WithTimeout = %v; want sandbox[default/claim-1]: ... ErrTimeout", err)
	}
}
