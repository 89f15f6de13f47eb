package sandbox

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	processv1 "agent-sandbox.invalid/clients/go/internal/processv1"
)

// brokenStreamService starts a process, sends "half" on stdout, and then fails the stream (the connection
// to the sandbox reset) without an exit event.
type brokenStreamService struct {
	processv1.UnimplementedProcessServiceServer
}

func (brokenStreamService) Start(_ *processv1.StartRequest, stream grpc.ServerStreamingServer[processv1.StartResponse]) error {
	if err := stream.Send(&processv1.StartResponse{Event: &processv1.StartResponse_Init{Init: &processv1.InitEvent{ProcessId: 9}}}); err != nil {
		return err
	}
	if err := stream.Send(&processv1.StartResponse{Event: &processv1.StartResponse_Stdout{Stdout: []byte("half")}}); err != nil {
		return err
	}
	return status.Error(codes.Unavailable, "connection reset by peer")
}

// After a broken stream every later Recv, Events and Wait report the break again. The next Recv used to
// return io.EOF as if the command had finished, Events then ended silently, and Wait said only "stream ended
// without an exit event".
func TestABrokenStreamKeepsItsError(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = io.WriteString(w, "{\"type\":\"start\",\"pid\":1}\n{\"type\":\"stdout\",\"data\":\"half\"}\n")
		w.(http.Flusher).Flush()
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			_ = conn.Close() // mid-body: no terminating chunk
		}
	})
	cases := []struct {
		name string
		s    *Sandbox
		is   func(error) bool
	}{
		{"legacy", openTestSandbox(t, Options{}, srv.URL, true, nil),
			func(err error) bool { return errors.Is(err, io.ErrUnexpectedEOF) }},
		{"sandboxd", openTestSandbox(t, Options{Runtime: RuntimeSandboxd}, "http://127.0.0.1:1", false,
			startGRPC(t, brokenStreamService{})),
			func(err error) bool { return status.Code(err) == codes.Unavailable }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, then := range []string{"Recv", "Wait", "Events"} {
				p, err := c.s.Start(context.Background(), "prog")
				if err != nil {
					t.Fatal(err)
				}
				if ev, err := p.Recv(); err != nil || string(ev.Data) != "half" {
					t.Fatalf("first event = %+v, %v", ev, err)
				}
				_, broke := p.Recv()
				if !c.is(broke) || !strings.HasPrefix(broke.Error(), "sandbox[default/claim-1]: ") {
					t.Fatalf("Recv at the break = %v", broke)
				}
				var again error
				switch then {
				case "Recv":
					_, again = p.Recv()
				case "Wait":
					var res *ExecutionResult
					res, again = p.Wait()
					if res != nil {
						t.Errorf("Wait after the break = %+v", res)
					}
				case "Events":
					for _, err := range p.Events() {
						again = err
					}
				}
				if again == nil || again.Error() != broke.Error() || !c.is(again) {
					t.Errorf("%s after the break = %v; want the break again: %v", then, again, broke)
				}
				_ = p.Close()
				if _, err := p.Recv(); err == nil || err.Error() != broke.Error() {
					t.Errorf("Recv after the break and Close = %v; want the break: %v", err, broke)
				}
			}
		})
	}
}
