package deps
import (
	_ "google.golang.org/grpc"
	_ "google.golang.org/grpc/health"
	_ "google.golang.org/protobuf/proto"
	_ "github.com/spf13/cobra"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/fsnotify/fsnotify"
	_ "golang.org/x/sys/unix"
	_ "github.com/google/renameio/v2"
	_ "sigs.k8s.io/yaml"
	_ "github.com/container-storage-interface/spec/lib/go/csi"
)
