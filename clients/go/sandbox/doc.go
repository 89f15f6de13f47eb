// Package sandbox is the Go client of agent-sandbox: it claims a sandbox from a SandboxWarmPool, waits until
// it is Ready, and then runs commands and moves files in it, through the sandbox router (legacy runtime) or
// straight to the sandbox Pod (sandboxd REST + gRPC).
//
// The surface follows the upstream Go SDK (kubernetes-sigs/agent-sandbox, clients/go/sandbox): [Options],
// [Client], [Sandbox] (which implements [Handle] and [Info]), the sentinel errors and [*HTTPError]. On top of
// it, as this project's Python SDK does: streaming execution ([Sandbox.Start], [WithStdout]), stdin, signals
// and a PTY on sandboxd, per-command environment, working directory and timeout, [Sandbox.Suspend] /
// [Sandbox.Resume], and [*ConditionError], which carries the claim's condition reason.
//
// Every call takes a [context.Context]; a call without a deadline is bounded by [Options.RequestTimeout]. A
// call ends when its context does (ErrTimeout at a deadline, context.Canceled at a cancel), even a
// [Sandbox.WriteFrom] whose reader blocks in Read: that Read is abandoned (see WriteFrom).
//
// The package keeps no global state: every [Client] and [Sandbox] owns its clients and transports. Each
// Sandbox has its own HTTP transport (unless [Options.HTTPTransport] gives one): [Sandbox.Close] and
// [Sandbox.Disconnect] close its kept-alive connections once no call is in flight, so a finished handle
// holds no connection to the router or the sandbox.
//
// A started command's stream ([Process]) that breaks before the exit event (the sandbox went away, a proxy
// cut it) reports the break from that Recv on, and from [Process.Wait] and [Process.Events]; io.EOF from
// Recv always means the exit event was delivered.
//
//	sb, err := sandbox.New(ctx, sandbox.Options{WarmPoolName: "python-pool", APIURL: "http://127.0.0.1:8080"})
//	if err != nil { ... }
//	if err := sb.Open(ctx); err != nil { ... }
//	defer sb.Close(context.Background())
//	res, err := sb.Run(ctx, "echo hello")
package sandbox
