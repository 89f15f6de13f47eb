// Command ttfi measures the Go SDK's time to first instruction for one batch of concurrent creates: each of
// -concurrent goroutines creates a sandbox from -pool through the router at -router and runs `echo ttfi`;
// the time from the create call to the command's answer is printed per sandbox as JSON, and every claim is
// deleted afterwards. benchmarks/go_sdk.py drives it against a dev cluster.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"agent-sandbox.invalid/clients/go/sandbox"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster")
	router := flag.String("router", "", "router URL")
	namespace := flag.String("namespace", "default", "namespace of the claims")
	pool := flag.String("pool", "", "SandboxWarmPool to claim from")
	concurrent := flag.Int("concurrent", 20, "sandboxes created at once")
	qps := flag.Float64("qps", 0, "client-side rate limit of the Kubernetes client (0: the SDK's default, none)")
	burst := flag.Int("burst", 0, "burst of that limit")
	flag.Parse()
	if err := run(*kubeconfig, *router, *namespace, *pool, *concurrent, float32(*qps), *burst); err != nil {
		fmt.Fprintln(os.Stderr, "ttfi:", err)
		os.Exit(1)
	}
}

func run(kubeconfig, router, namespace, pool string, n int, qps float32, burst int) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = qps, burst
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	client, err := sandbox.NewClient(ctx, sandbox.Options{APIURL: router, Namespace: namespace, RestConfig: cfg, Quiet: true})
	if err != nil {
		return err
	}
	defer func() { _ = client.DeleteAll(context.Background()) }()
	ttfi := make([]float64, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			t0 := time.Now()
			sb, err := client.CreateSandbox(ctx, pool, namespace)
			if err == nil {
				var res *sandbox.ExecutionResult
				if res, err = sb.Run(ctx, "echo ttfi"); err == nil && res.Stdout != "ttfi\n" {
					err = fmt.Errorf("unexpected output %q", res.Stdout)
				}
			}
			ttfi[i], errs[i] = float64(time.Since(t0).Microseconds())/1000, err
		}()
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{"ttfi_ms": ttfi})
}
