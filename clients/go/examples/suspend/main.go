// Command suspend shows the error types and suspend/resume: a claim from a missing pool fails with the
// claim's condition reason, then a real sandbox is suspended (its Pod deleted, volumes kept) and resumed.
//
//	go run ./examples/suspend -pool python-pool -router "$AGENT_SANDBOX_ROUTER_URL"
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"time"

	"agent-sandbox.invalid/clients/go/sandbox"
)

func main() {
	pool := flag.String("pool", "python-pool", "SandboxWarmPool to claim from")
	namespace := flag.String("namespace", "default", "namespace of the claim")
	router := flag.String("router", "", "router URL (direct mode); empty: port-forward")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	bad, err := sandbox.New(ctx, sandbox.Options{WarmPoolName: "no-such-pool", Namespace: *namespace, APIURL: *router})
	if err != nil {
		log.Fatal(err)
	}
	err = bad.Open(ctx)
	var cond *sandbox.ConditionError
	switch {
	case errors.Is(err, sandbox.ErrWarmPoolNotFound) && errors.As(err, &cond):
		fmt.Printf("as expected: %s says %s (%s)\n", cond.Kind, cond.Reason, cond.Message)
	default:
		log.Fatalf("unexpected: %v", err)
	}

	sb, err := sandbox.New(ctx, sandbox.Options{WarmPoolName: *pool, Namespace: *namespace, APIURL: *router})
	if err != nil {
		log.Fatal(err)
	}
	if err := sb.Open(ctx); err != nil {
		log.Fatal(err)
	}
	defer sb.Close(context.Background())
	if err := sb.Suspend(ctx); err != nil {
		log.Fatal(err)
	}
	st, err := sb.Status(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("suspended=%v ready=%v reason=%s\n", st.Suspended, st.Ready, st.Reason)
	if err := sb.Resume(ctx); err != nil {
		log.Fatal(err)
	}
	res, err := sb.Run(ctx, "echo resumed")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(res.Stdout)
}
