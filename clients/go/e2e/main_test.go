//go:build e2e

// Package e2e drives the Go SDK against a real local control plane: kube-apiserver + the project's
// controller + the router + the dev cluster's local runner, started by the same Python fixtures the Python
// suite uses (tests/go_sdk_cluster.py). Run: `go test -tags e2e ./e2e/` from clients/go. If the cluster
// cannot start, TestMain fails the run; nothing is skipped.
package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"agent-sandbox.invalid/clients/go/sandbox"
)

// cluster is what tests/go_sdk_cluster.py prints.
var cluster struct {
	Name       string `json:"name"`
	Kubeconfig string `json:"kubeconfig"`
	RouterURL  string `json:"router_url"`
	Namespace  string `json:"namespace"`
	WarmPool   string `json:"warm_pool"`
	ColdPool   string `json:"cold_pool"`
	Image      string `json:"image"`
}

var (
	restConfig *rest.Config
	k8s        *sandbox.K8sHelper
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	// every test picks its mode explicitly
	_ = os.Unsetenv(sandbox.RouterURLEnv)
	root, err := filepath.Abs("../../..")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	python := os.Getenv("AGENT_SANDBOX_PYTHON")
	if python == "" {
		python = filepath.Join(root, ".venv", "bin", "python")
	}
	cmd := exec.Command(python, "-m", "tests.go_sdk_cluster")
	cmd.Dir = root
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: cannot start the cluster fixture (%s): %v\n", python, err)
		return 1
	}
	defer func() {
		_ = stdin.Close() // the fixture tears the cluster down when its stdin closes
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(90 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}()
	line := make(chan string, 1)
	go func() {
		r := bufio.NewReader(stdout)
		s, _ := r.ReadString('\n')
		line <- s
		_, _ = io.Copy(io.Discard, r)
	}()
	select {
	case s := <-line:
		if err := json.Unmarshal([]byte(s), &cluster); err != nil || cluster.Kubeconfig == "" {
			fmt.Fprintf(os.Stderr, "e2e: the cluster fixture failed (output %q): %v\n", s, err)
			return 1
		}
	case <-time.After(10 * time.Minute):
		fmt.Fprintln(os.Stderr, "e2e: the cluster fixture did not report ready within 10 minutes")
		return 1
	}
	restConfig, err = clientcmd.BuildConfigFromFlags("", cluster.Kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: kubeconfig:", err)
		return 1
	}
	if k8s, err = sandbox.NewK8sHelper(restConfig, testLogger()); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	return m.Run()
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
