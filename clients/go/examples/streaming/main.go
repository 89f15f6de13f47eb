// Command streaming runs a command on a sandboxd sandbox and prints its output as it happens, feeds it
// stdin, and interrupts a second one with a signal. It dials the sandbox Pod directly
// (ConnectivityInCluster), so run it where Pod IPs are reachable:
//
//	go run ./examples/streaming -pool sandboxd-pool -namespace default
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"strings"
	"time"

	"agent-sandbox.invalid/clients/go/sandbox"
)

func main() {
	pool := flag.String("pool", "sandboxd-pool", "SandboxWarmPool to claim from")
	namespace := flag.String("namespace", "default", "namespace of the claim")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sb, err := sandbox.New(ctx, sandbox.Options{
		WarmPoolName: *pool, Namespace: *namespace,
		Runtime: sandbox.RuntimeSandboxd, Connectivity: sandbox.ConnectivityInCluster,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := sb.Open(ctx); err != nil {
		log.Fatal(err)
	}
	defer sb.Close(context.Background())

	// 1. output as it happens, straight to our stdout/stderr
	res, err := sb.Run(ctx, "for i in 1 2 3; do echo tick $i; sleep 1; done; echo done >&2",
		sandbox.WithStdout(os.Stdout), sandbox.WithStderr(os.Stderr))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit code:", res.ExitCode)

	// 2. stdin, with per-command environment and working directory
	res, err = sb.Run(ctx, "tr a-z A-Z; echo \"in $PWD as $WHO\"",
		sandbox.WithStdin(strings.NewReader("shout\n")), sandbox.WithEnv(map[string]string{"WHO": "example"}))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(res.Stdout)

	// 3. a long-running process, read event by event and stopped with SIGINT
	p, err := sb.Start(ctx, "i=0; while true; do i=$((i+1)); echo $i; sleep 0.5; done")
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	for {
		ev, err := p.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			log.Fatal(err)
		}
		switch ev.Type {
		case sandbox.EventStdout:
			fmt.Printf("got %s", ev.Data)
			if strings.TrimSpace(string(ev.Data)) == "3" {
				if err := p.Signal(ctx, sandbox.SignalInterrupt); err != nil {
					log.Fatal(err)
				}
			}
		case sandbox.EventExit:
			fmt.Println("stopped, exit code", ev.ExitCode)
		}
	}
}
