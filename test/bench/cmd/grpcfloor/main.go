// Command grpcfloor serves gRPC's standard health service, and nothing else, on the unix socket named by
// its one argument, until SIGTERM or SIGINT: grpc-go with the one server option every crust server takes
// (command.StreamWorkers), and none of crustd's interceptors, credentials or codec. An empty
// call to it is the least a call to a daemon reached over gRPC costs on the machine: the control-path
// benchmark (test/bench/control) measures it beside crustd.
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"crust.dev/crust/pkg/command"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: grpcfloor SOCKET")
		os.Exit(2)
	}
	lis, err := net.Listen("unix", os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	g := grpc.NewServer(command.StreamWorkers())
	healthpb.RegisterHealthServer(g, health.NewServer()) // SERVING from the start
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() { <-ctx.Done(); g.Stop() }()
	if err := g.Serve(lis); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
