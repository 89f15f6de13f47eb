package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"sync"
)

// EventType says what an Event carries.
type EventType int

const (
	// EventStdout carries a chunk of standard output (all output, with a PTY).
	EventStdout EventType = iota + 1
	// EventStderr carries a chunk of standard error.
	EventStderr
	// EventExit is the last event: the exit code (and TimedOut).
	EventExit
)

func (t EventType) String() string {
	switch t {
	case EventStdout:
		return "stdout"
	case EventStderr:
		return "stderr"
	case EventExit:
		return "exit"
	}
	return fmt.Sprintf("EventType(%d)", int(t))
}

// Event is one thing a running command reported, in the order it happened.
type Event struct {
	Type     EventType
	Data     []byte // EventStdout / EventStderr
	ExitCode int    // EventExit; -1 when the program was killed by a signal
	TimedOut bool   // EventExit: killed by WithCommandTimeout
}

// processBackend is what a runtime provides for a started command.
type processBackend interface {
	// recv returns the next event; after EventExit it is not called again.
	recv() (Event, error)
	writeStdin(ctx context.Context, data []byte, eof bool) error
	signal(ctx context.Context, sig Signal) error
	resize(ctx context.Context, cols, rows uint32) error
	// stop ends the stream (the runtime kills the command if it still runs).
	stop()
}

// Process is a command started with Start: read its events with Recv (or collect them with Wait), talk to
// it with WriteStdin / CloseStdin / Signal / ResizeTTY (sandboxd), and end it early with Close. Recv and
// Wait must be called from one goroutine; the other methods may be called from any.
type Process struct {
	id      int
	backend processBackend
	release func() // ends the sandbox's in-flight accounting, once

	// ended is why the stream's context ended (nil while it runs, or when the Process ended it itself); wrap
	// prefixes "sandbox[ns/claim]:". Both are set by Sandbox.Start: until December 6 a Process's errors had
	// neither the prefix nor, for a deadline, ErrTimeout.
	ended func() error
	wrap  func(error) error

	mu       sync.Mutex
	finished bool
	// closed: Close ended the stream before its exit event (a Close after the exit changes nothing).
	closed bool
	exit   *Event
	// broken is the error of a stream that broke before its exit event, returned by every later Recv (and so
	// by Wait and Events): until December 6 the next Recv returned io.EOF as if the command had finished,
	// and Wait said only "stream ended without an exit event".
	broken error
	// cut: the handle ended the stream (Close, Disconnect, Suspend, Resume; abort); broken says so.
	cut bool
}

func newProcess(id int, b processBackend, release func()) *Process {
	return &Process{id: id, backend: b, release: release,
		ended: func() error { return nil }, wrap: func(err error) error { return err }}
}

// fail reports err as every SDK error is reported: prefixed with the sandbox, and after a context ended
// (cause) ErrTimeout for its deadline (also context.DeadlineExceeded), or context.Canceled.
func (p *Process) fail(cause, err error) error {
	return p.wrap(withContextCause(cause, err))
}

// withContextCause makes err match the context error that caused it (cause, nil when none did): a deadline
// is ErrTimeout and context.DeadlineExceeded, as a call's deadline is everywhere.
func withContextCause(cause, err error) error {
	switch {
	case cause == nil || errors.Is(err, ErrTimeout):
	case errors.Is(cause, context.DeadlineExceeded) && errors.Is(err, cause):
		err = fmt.Errorf("%w: %w", ErrTimeout, err)
	case errors.Is(cause, context.DeadlineExceeded):
		err = fmt.Errorf("%w (%w): %w", ErrTimeout, cause, err)
	case !errors.Is(err, cause):
		err = fmt.Errorf("%w: %w", cause, err)
	}
	return err
}

// ID is the runtime's id of the process (sandboxd's process_id; the legacy runtime's pid).
func (p *Process) ID() int { return p.id }

// Recv returns the next event. After EventExit it returns io.EOF; when the stream breaks, its error, then
// that error again on every later call (a Close after it changes nothing); once Close ended the stream
// before the exit (also from another goroutine, during a Recv), ErrProcessClosed, every time.
func (p *Process) Recv() (Event, error) {
	p.mu.Lock()
	if p.exit != nil { // first: a Close that raced the exit event's return below came after the exit
		p.mu.Unlock()
		return Event{}, io.EOF
	}
	if p.closed {
		p.mu.Unlock()
		return Event{}, p.closedError()
	}
	if p.finished {
		broken := p.broken
		p.mu.Unlock()
		if broken != nil {
			return Event{}, broken
		}
		return Event{}, io.EOF
	}
	p.mu.Unlock()
	ev, err := p.backend.recv()
	if err != nil {
		err = p.fail(p.ended(), err) // before finish, which cancels the stream's context
		p.mu.Lock()
		if p.cut {
			// the handle ended the stream meanwhile (abort): its reason, not the runtime's cancellation
			broken := p.broken
			p.mu.Unlock()
			return Event{}, broken
		}
		if p.closed {
			p.mu.Unlock()
			// Close cut the stream: the runtime's error for that (legacy "context canceled", which matched
			// context.Canceled though the caller cancelled nothing; sandboxd "code = Canceled") is not the
			// caller's news, and the next Recv used to return io.EOF as if the command had finished.
			return Event{}, p.closedError()
		}
		// kept as the Process is marked finished, at once: a Close from another goroutine cannot come in
		// between and turn the break into ErrProcessClosed
		p.broken = err
		already := p.finished
		p.finished = true
		p.mu.Unlock()
		p.stopOnce(already)
		return Event{}, err
	}
	if ev.Type == EventExit {
		// A Close between the backend's answer and here marked the Process closed before its exit: it came
		// after the exit (the command had ended), so it changes nothing. Until December 6 Events and Recv
		// then gave a spurious ErrProcessClosed after the exit event, and the stdin calls refused.
		p.mu.Lock()
		p.exit, p.closed = &ev, false
		p.mu.Unlock()
		p.finish()
	}
	return ev, nil
}

// abort ends the stream because the handle takes its transport away (Close, Disconnect, Suspend, Resume):
// the runtime kills the command, and Recv - also one in progress in another goroutine -, Wait, Events and
// the stdin, signal and resize calls return ErrNotReady wrapping ErrTransportClosed, with why. Nothing
// changes after the exit event, a break or a Close.
func (p *Process) abort(why string) {
	p.mu.Lock()
	if p.finished {
		p.mu.Unlock()
		return
	}
	p.broken = p.wrap(fmt.Errorf("%w: process %d: %w (%s)", ErrNotReady, p.id, ErrTransportClosed, why))
	p.finished, p.cut = true, true
	p.mu.Unlock()
	p.backend.stop()
	p.release()
}

func (p *Process) closedError() error {
	return p.wrap(fmt.Errorf("process %d: %w", p.id, ErrProcessClosed))
}

func (p *Process) finish() {
	p.mu.Lock()
	already := p.finished
	p.finished = true
	p.mu.Unlock()
	p.stopOnce(already)
}

// stopOnce ends the stream and its in-flight accounting, unless already finished.
func (p *Process) stopOnce(already bool) {
	if !already {
		p.backend.stop()
		p.release()
	}
}

// Events iterates over the remaining events (ending after EventExit); a broken stream yields its error
// last. Breaking out of the loop leaves the process running: Close it.
//
//	for ev, err := range p.Events() { ... }
func (p *Process) Events() iter.Seq2[Event, error] {
	return func(yield func(Event, error) bool) {
		for {
			ev, err := p.Recv()
			if errors.Is(err, io.EOF) {
				return
			}
			if !yield(ev, err) || err != nil {
				return
			}
		}
	}
}

// Wait reads the remaining events and returns the result. Output already consumed by Recv is not in it;
// output for which a writer is given goes to that writer instead. A stream that broke before the exit
// event (also in an earlier Recv) is an error: the break's.
func (p *Process) Wait() (*ExecutionResult, error) {
	return p.collect(nil, nil)
}

func (p *Process) collect(stdout, stderr io.Writer) (*ExecutionResult, error) {
	var outBuf, errBuf bytes.Buffer
	if stdout == nil {
		stdout = &outBuf
	}
	if stderr == nil {
		stderr = &errBuf
	}
	for {
		ev, err := p.Recv()
		if errors.Is(err, io.EOF) {
			p.mu.Lock()
			exit, broken := p.exit, p.broken
			p.mu.Unlock()
			if exit == nil && broken != nil {
				return nil, broken // why it ended (Recv returns it; this is a break that wraps io.EOF)
			}
			if exit == nil {
				return nil, p.wrap(fmt.Errorf("process %d: stream ended without an exit event", p.id))
			}
			return &ExecutionResult{
				Stdout: outBuf.String(), Stderr: errBuf.String(), ExitCode: exit.ExitCode, TimedOut: exit.TimedOut,
			}, nil
		}
		if err != nil {
			return nil, err
		}
		var werr error
		switch ev.Type {
		case EventStdout:
			_, werr = stdout.Write(ev.Data)
		case EventStderr:
			_, werr = stderr.Write(ev.Data)
		case EventExit:
			return &ExecutionResult{
				Stdout: outBuf.String(), Stderr: errBuf.String(), ExitCode: ev.ExitCode, TimedOut: ev.TimedOut,
			}, nil
		}
		if werr != nil {
			_ = p.Close()
			return nil, p.wrap(fmt.Errorf("process %d: writing output: %w", p.id, werr))
		}
	}
}

// WriteStdin writes data to the command's standard input (sandboxd).
func (p *Process) WriteStdin(ctx context.Context, data []byte) error {
	if err := p.closedNow(); err != nil {
		return err
	}
	if err := p.backend.writeStdin(ctx, data, false); err != nil {
		return p.fail(ctx.Err(), err)
	}
	return nil
}

// CloseStdin closes the command's standard input (sandboxd).
func (p *Process) CloseStdin(ctx context.Context) error {
	if err := p.closedNow(); err != nil {
		return err
	}
	if err := p.backend.writeStdin(ctx, nil, true); err != nil {
		return p.fail(ctx.Err(), err)
	}
	return nil
}

// Signal sends sig to the command's process group (sandboxd).
func (p *Process) Signal(ctx context.Context, sig Signal) error {
	if err := p.closedNow(); err != nil {
		return err
	}
	if err := p.backend.signal(ctx, sig); err != nil {
		return p.fail(ctx.Err(), err)
	}
	return nil
}

// ResizeTTY changes the terminal size of a command started WithPTY (sandboxd).
func (p *Process) ResizeTTY(ctx context.Context, cols, rows uint32) error {
	if err := p.closedNow(); err != nil {
		return err
	}
	if err := p.backend.resize(ctx, cols, rows); err != nil {
		return p.fail(ctx.Err(), err)
	}
	return nil
}

// Close ends the stream; a command still running is killed by the runtime, and Recv, Wait and Events then
// return ErrProcessClosed (after the exit event they keep returning io.EOF, after a broken stream its
// error). Safe to call more than once, and from any goroutine.
func (p *Process) Close() error {
	p.mu.Lock()
	if !p.finished {
		p.closed = true
	}
	p.mu.Unlock()
	p.finish()
	return nil
}

// closedNow reports a Process that Close ended before its exit (the stdin, signal and resize calls refuse).
func (p *Process) closedNow() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return p.closedError()
	}
	if p.cut {
		return p.broken // the handle ended the stream: the command is gone
	}
	return nil
}
