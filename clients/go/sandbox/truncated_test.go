package sandbox

import (
	"context"
	"testing"

	processv1 "agent-sandbox.invalid/clients/go/internal/processv1"
)

// Probe of December 6: sandboxd's Run said Truncated=false for output the runtime had cut (its stdout ended
// with the marker "[output truncated: N more bytes]"); the legacy runtime's answer said true. process.v1 has
// no field for it: this project's runtime marks the kept output with that line (runtime/processes.py
// BoundedOutput), which is what Run reads now.

type markedExecute struct {
	processv1.UnimplementedProcessServiceServer
	stdout, stderr string
}

func (f *markedExecute) Execute(context.Context, *processv1.ExecuteRequest) (*processv1.ExecuteResponse, error) {
	return &processv1.ExecuteResponse{Stdout: []byte(f.stdout), Stderr: []byte(f.stderr)}, nil
}

func TestSandboxdRunReportsTheRuntimesTruncation(t *testing.T) {
	for _, tc := range []struct {
		name, stdout, stderr string
		want                 bool
	}{
		{"stdout cut", "0000\n[output truncated: 2999000 more bytes]\n", "", true},
		{"stderr cut", "ok\n", "eeee\n[output truncated: 12 more bytes]\n", true},
		{"whole", "all of it\n", "", false},
		{"the marker mid-output", "\n[output truncated: 5 more bytes]\nand more\n", "", false},
		{"not the runtime's marker", "[output truncated: many more bytes]\n", "", false},
	} {
		s := openTestSandbox(t, Options{Runtime: RuntimeSandboxd}, "http://127.0.0.1:1", false,
			startGRPC(t, &markedExecute{stdout: tc.stdout, stderr: tc.stderr}))
		res, err := s.Run(context.Background(), "x")
		if err != nil || res.Truncated != tc.want || res.Stdout != tc.stdout {
			t.Errorf("%s: Run = %+v, %v; want Truncated %v, the output as sent", tc.name, res, err, tc.want)
		}
	}
}
