package sandbox

import (
	"context"
	"io"
	"io/fs"
	"time"
)

// ExecutionResult is the outcome of a command.
type ExecutionResult struct {
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	ExitCode int    `json:"exit_code"`
	// TimedOut: the command outlived WithCommandTimeout and was killed (ExitCode is then the runtime's
	// report, 124 on sandboxd).
	TimedOut bool `json:"timed_out"`
	// Truncated: the runtime kept only the start of the output (this project's runtime caps buffered
	// output; streamed output is never truncated). The legacy runtime answers it; on sandboxd, whose
	// process.v1 has no such field, it is read from the marker line this project's runtime ends a cut
	// output with ("[output truncated: N more bytes]", kept in Stdout / Stderr). That is a heuristic: on
	// sandboxd an output that itself ends with such a line (a command printing it, `cat` of a file ending
	// with it) is reported Truncated too - also by upstream's sandboxd, which never truncates; the output
	// itself is always what the runtime returned.
	Truncated bool `json:"truncated"`
}

// FileType is the type of a FileEntry.
type FileType string

const (
	FileTypeFile      FileType = "file"
	FileTypeDirectory FileType = "directory"
)

// FileEntry is one child of a listed directory; both runtimes' listings are normalised to it.
type FileEntry struct {
	Name    string
	Size    int64
	Type    FileType
	ModTime time.Time // UTC
	Mode    string    // "0644" on sandboxd and this project's legacy runtime; empty on upstream's legacy runtime
}

// Key identifies a sandbox in a Client's registry.
type Key struct {
	Namespace string
	ClaimName string
}

// Handle is the core API of a sandbox; accept it in your code to test with fakes. *Sandbox implements it.
type Handle interface {
	Open(ctx context.Context) error
	Close(ctx context.Context) error
	Disconnect(ctx context.Context) error
	IsReady() bool

	Run(ctx context.Context, command string, opts ...CallOption) (*ExecutionResult, error)
	Write(ctx context.Context, path string, content []byte, opts ...CallOption) error
	Read(ctx context.Context, path string, opts ...CallOption) ([]byte, error)
	List(ctx context.Context, path string, opts ...CallOption) ([]FileEntry, error)
	Exists(ctx context.Context, path string, opts ...CallOption) (bool, error)
}

// Info is read-only identity of a sandbox. *Sandbox implements it.
type Info interface {
	ClaimName() string
	SandboxName() string
	PodName() string
	PodIP() string
	Annotations() map[string]string
}

var (
	_ Handle = (*Sandbox)(nil)
	_ Info   = (*Sandbox)(nil)
)

// Signal is a signal for a process started with Start (sandboxd's process.v1.Signal numbers).
type Signal int32

const (
	SignalInterrupt Signal = 2  // SIGINT
	SignalKill      Signal = 9  // SIGKILL
	SignalTerminate Signal = 15 // SIGTERM
)

// CallOption tunes one call. WithTimeout and WithMaxAttempts apply to every call; the others only to Run
// and Start (passing them to a file call is an ErrInvalidArgument).
type CallOption func(*callOptions)

type callOptions struct {
	timeout     time.Duration
	maxAttempts int

	// command options
	execSet        bool
	env            map[string]string
	cwd            string
	commandTimeout time.Duration
	timeoutSet     bool // WithTimeout was given (zero or negative too: a deadline already past)
	stdout, stderr io.Writer
	stdin          io.Reader
	pty            *ptySize

	// file options
	fileMode *fs.FileMode
}

type ptySize struct{ cols, rows uint32 }

// WithTimeout bounds the whole call (all attempts), replacing RequestTimeout and any shorter context
// deadline is still honoured. Zero or negative is a deadline already past, as with context.WithTimeout: the
// call fails at once with ErrTimeout and sends nothing.
func WithTimeout(d time.Duration) CallOption {
	return func(o *callOptions) { o.timeout, o.timeoutSet = d, true }
}

// WithMaxAttempts sets how many attempts a call makes (default 6 for file calls, 1 for Run). Values <= 0
// keep the default.
func WithMaxAttempts(n int) CallOption {
	return func(o *callOptions) {
		if n > 0 {
			o.maxAttempts = n
		}
	}
}

// WithEnv adds environment variables to one command (keys non-empty, without "=").
func WithEnv(env map[string]string) CallOption {
	return func(o *callOptions) { o.execSet = true; o.env = env }
}

// WithCwd sets the working directory of one command, relative to the runtime root.
func WithCwd(dir string) CallOption { return func(o *callOptions) { o.execSet = true; o.cwd = dir } }

// WithCommandTimeout kills the command after d; the result then has TimedOut set (no error).
func WithCommandTimeout(d time.Duration) CallOption {
	return func(o *callOptions) { o.execSet = true; o.commandTimeout = d }
}

// WithStdout / WithStderr stream a Run's output to w as it arrives; that stream is then not kept in the
// ExecutionResult.
func WithStdout(w io.Writer) CallOption {
	return func(o *callOptions) { o.execSet = true; o.stdout = w }
}

// WithStderr: see WithStdout.
func WithStderr(w io.Writer) CallOption {
	return func(o *callOptions) { o.execSet = true; o.stderr = w }
}

// WithStdin feeds r to the command's standard input, then closes it (sandboxd only).
func WithStdin(r io.Reader) CallOption { return func(o *callOptions) { o.execSet = true; o.stdin = r } }

// WithFileMode gives the file a Write or WriteFrom creates these permission bits (0o755 for a script to
// run), instead of the runtime's 0644. sandboxd sets them as it writes; the legacy runtime has no mode in
// its upload, so a chmod command follows it (one more round trip; the image needs chmod).
func WithFileMode(perm fs.FileMode) CallOption { return func(o *callOptions) { o.fileMode = &perm } }

// WithPTY runs the command on a terminal of the given size (sandboxd only); all output arrives as stdout.
func WithPTY(cols, rows uint32) CallOption {
	return func(o *callOptions) { o.execSet = true; o.pty = &ptySize{cols: cols, rows: rows} }
}

func buildCallOptions(opts []CallOption) callOptions {
	var o callOptions
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	return o
}

// streaming says whether a Run must use the streaming protocol (Start) rather than the buffered one.
func (o *callOptions) streaming() bool {
	return o.stdout != nil || o.stderr != nil || o.stdin != nil || o.pty != nil
}

func (o *callOptions) validateExec() error {
	for k := range o.env {
		if k == "" || containsByte(k, '=') || containsByte(k, 0) {
			return invalidf("environment variable name %q must be non-empty and contain no '=' or NUL", k)
		}
	}
	if o.commandTimeout < 0 {
		return invalidf("command timeout must not be negative")
	}
	return nil
}

func containsByte(s string, b byte) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == b {
			return true
		}
	}
	return false
}
