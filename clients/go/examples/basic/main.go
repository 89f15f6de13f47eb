// Command basic claims a sandbox from a warm pool, runs a command, writes and reads a file, and deletes
// the claim. Usage:
//
//	go run ./examples/basic -pool python-pool -namespace default -router "$AGENT_SANDBOX_ROUTER_URL"
//
// Without -router the SDK port-forwards to a Pod of the router Service (sandbox-router-svc) through the API
// server; -router-namespace says where that Service is (default: the claim's namespace, as upstream's SDK).
// With -gateway the SDK reads the router's address from that Gateway API Gateway's status.addresses.
// -runtime and -connectivity pick the runtime protocol and an in-cluster mode; -claim uses an existing claim
// (left in place) instead of creating one.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"time"

	"agent-sandbox.invalid/clients/go/sandbox"
)

func main() {
	pool := flag.String("pool", "python-pool", "SandboxWarmPool to claim from")
	namespace := flag.String("namespace", "default", "namespace of the claim")
	router := flag.String("router", "", "router URL (direct mode); empty: port-forward to sandbox-router-svc")
	routerNamespace := flag.String("router-namespace", "", "namespace of sandbox-router-svc (port-forward mode)")
	gateway := flag.String("gateway", "", "Gateway in front of the router (gateway mode)")
	gatewayNamespace := flag.String("gateway-namespace", "", "namespace of the Gateway (default: default)")
	runtime := flag.String("runtime", "", "runtime protocol: legacy-python (default) or sandboxd")
	connectivity := flag.String("connectivity", "", "port-forward, in-cluster or in-cluster-service")
	claim := flag.String("claim", "", "use this existing claim instead of creating one (it is not deleted)")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	client, err := sandbox.NewClient(ctx, sandbox.Options{
		APIURL: *router, Namespace: *namespace, RouterNamespace: *routerNamespace,
		GatewayName: *gateway, GatewayNamespace: *gatewayNamespace,
		Runtime: sandbox.Runtime(*runtime), Connectivity: sandbox.Connectivity(*connectivity),
	})
	if err != nil {
		log.Fatal(err)
	}

	var sb *sandbox.Sandbox
	if *claim != "" {
		sb, err = client.GetSandbox(ctx, *claim, *namespace)
	} else {
		stop := client.EnableAutoCleanup() // delete the claims on Ctrl-C
		defer stop()
		defer func() {
			if err := client.DeleteAll(context.Background()); err != nil {
				log.Print(err)
			}
		}()
		sb, err = client.CreateSandbox(ctx, *pool, *namespace)
	}
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("claim %s -> sandbox %s (pod %s)\n", sb.ClaimName(), sb.SandboxName(), sb.PodName())

	res, err := sb.Run(ctx, "echo 'Hello from Agent Sandbox!'")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(res.Stdout)

	if err := sb.Write(ctx, "hello.txt", []byte("hi")); err != nil {
		log.Fatal(err)
	}
	content, err := sb.Read(ctx, "hello.txt")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("hello.txt: %s\n", content)
}
