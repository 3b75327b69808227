// Package crisandbox finds the Kata sandbox of a pod the way a node's tools can without the sandbox's
// help: the CRI runtime's list of the pod's ready sandboxes (ListPodSandbox over the CRI socket, by the
// pod UID label kubelet puts on every sandbox), then the sandbox whose Kata shim serves its management
// socket under one of the Kata shim directories. Kata's runtime-rs never records the sandbox id in a
// volume's Kata directory, so this is how crustd learns which sandbox uses such a volume: a Finder is the
// Kata adapter's kata.SandboxFinder, and handlerwatch's check that such a sandbox is still there.
//
// Promises:
//   - Every CRI call is bounded by Config.Timeout; an absent or silent CRI socket costs at most that, and
//     is an error wrapping errdefs.ErrUnavailable, never a hang. The first failure after a success is
//     logged at warn, the rest at debug, so a node without that runtime is not flooded.
//   - A shim socket counts only when it is a socket (not a link, not a file) owned by crustd's own user,
//     in a sandbox directory that is a directory (not a link) owned by that user: a name planted by
//     someone else is never taken for a sandbox.
//   - Sandbox ids from the runtime are used as file names only when they are plain names (see
//     kata.ShimSockets); others are skipped.
package crisandbox

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/kata"
	"crust.dev/crust/api/version"
)

// DefaultEndpoint is containerd's CRI socket.
const DefaultEndpoint = "unix:///run/containerd/containerd.sock"

// DefaultTimeout bounds one CRI call.
const DefaultTimeout = 2 * time.Second

// PodUIDLabel is the label kubelet puts on every pod sandbox, naming its pod's UID.
const PodUIDLabel = "io.kubernetes.pod.uid"

// Config is what a Finder needs.
type Config struct {
	// Endpoint is the CRI runtime's socket, as unix:///path.
	Endpoint string
	// ShimDirs are the Kata shim directories, searched in order for <dir>/<sandbox id>/shim-monitor.sock;
	// empty means kata.DefaultShimDirs.
	ShimDirs []string
	// Timeout bounds each CRI call; 0 or less means DefaultTimeout.
	Timeout time.Duration
	Log     *slog.Logger
}

// Finder asks one CRI runtime about sandboxes. Its methods may be called concurrently. Close it when done.
type Finder struct {
	cfg    Config
	conn   *grpc.ClientConn
	cri    runtimeapi.RuntimeServiceClient
	failed atomic.Bool // the last CRI call failed: log the next failures at debug only
}

// New returns a Finder of the runtime at cfg.Endpoint. It does not connect: the first call does, and a
// runtime that is not there yet is found once it is.
func New(cfg Config) (*Finder, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if len(cfg.ShimDirs) == 0 {
		cfg.ShimDirs = kata.DefaultShimDirs()
	}
	conn, err := grpc.NewClient(cfg.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithUserAgent(version.UserAgent()))
	if err != nil {
		return nil, fmt.Errorf("CRI endpoint %q: %w", cfg.Endpoint, err)
	}
	return &Finder{cfg: cfg, conn: conn, cri: runtimeapi.NewRuntimeServiceClient(conn)}, nil
}

// Close closes the connection to the runtime.
func (f *Finder) Close() error { return f.conn.Close() }

// KataSandboxes returns, by pod UID, the ids (sorted) of the sandboxes that the CRI runtime lists as
// ready and whose Kata shim serves a management socket (ShimSocket): of pod podUID only, or of every pod
// when podUID is "" (one call to the runtime either way). Pods without one are absent.
func (f *Finder) KataSandboxes(ctx context.Context, podUID string) (map[string][]string, error) {
	filter := &runtimeapi.PodSandboxFilter{}
	if podUID != "" {
		filter.LabelSelector = map[string]string{PodUIDLabel: podUID}
	}
	items, err := f.list(ctx, filter)
	if err != nil {
		return nil, err
	}
	byPod := map[string][]string{}
	for _, sb := range items {
		uid := sb.GetLabels()[PodUIDLabel]
		// The runtime filtered already; one that ignores the filter must not hand us another pod.
		if uid == "" || (podUID != "" && uid != podUID) {
			continue
		}
		if _, ok := f.ShimSocket(sb.GetId()); ok {
			byPod[uid] = append(byPod[uid], sb.GetId())
		}
	}
	for uid, ids := range byPod {
		slices.Sort(ids)
		byPod[uid] = slices.Compact(ids)
	}
	return byPod, nil
}

// Ready reports whether the CRI runtime lists sandboxID as ready.
func (f *Finder) Ready(ctx context.Context, sandboxID string) (bool, error) {
	items, err := f.list(ctx, &runtimeapi.PodSandboxFilter{Id: sandboxID})
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(items, func(sb *runtimeapi.PodSandbox) bool { return sb.GetId() == sandboxID }), nil
}

// list asks the runtime for its ready sandboxes that pass filter, within the timeout.
func (f *Finder) list(ctx context.Context, filter *runtimeapi.PodSandboxFilter) ([]*runtimeapi.PodSandbox, error) {
	filter.State = &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY}
	ctx, cancel := context.WithTimeout(ctx, f.cfg.Timeout)
	defer cancel()
	resp, err := f.cri.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: filter})
	if err != nil {
		err = fmt.Errorf("list pod sandboxes at CRI endpoint %s: %v: %w", f.cfg.Endpoint, err, errdefs.ErrUnavailable)
		level := slog.LevelWarn
		if f.failed.Swap(true) {
			level = slog.LevelDebug
		}
		f.cfg.Log.Log(ctx, level, "the CRI runtime does not answer; Kata sandboxes that record no sandbox id are not found", "err", err)
		return nil, err
	}
	if f.failed.Swap(false) {
		f.cfg.Log.Info("the CRI runtime answers again", "endpoint", f.cfg.Endpoint)
	}
	var ready []*runtimeapi.PodSandbox
	for _, sb := range resp.GetItems() {
		if sb.GetState() == runtimeapi.PodSandboxState_SANDBOX_READY {
			ready = append(ready, sb)
		}
	}
	return ready, nil
}

// ShimSocket returns the first management socket of sandboxID's Kata shim among the shim directories
// that is a socket owned by crustd's user in a directory owned by that user, neither of them a link. An
// id that is not a plain file name has none.
func (f *Finder) ShimSocket(sandboxID string) (string, bool) {
	socks, err := kata.ShimSockets(f.cfg.ShimDirs, sandboxID)
	if err != nil {
		return "", false
	}
	for _, s := range socks {
		if owned(filepath.Dir(s), fs.ModeDir) && owned(s, fs.ModeSocket) {
			return s, true
		}
	}
	return "", false
}

// ShimSockets returns every place sandboxID's Kata shim may serve its management socket, in order.
func (f *Finder) ShimSockets(sandboxID string) ([]string, error) {
	return kata.ShimSockets(f.cfg.ShimDirs, sandboxID)
}

// owned reports whether path itself (not what a link there points to) is of type typ and owned by this
// process's user.
func owned(path string, typ fs.FileMode) bool {
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode().Type() != typ {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == os.Geteuid()
}
