package csiproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"crust.dev/crust/api/client"
	"crust.dev/crust/api/crustd"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/unixsocket"
	"crust.dev/crust/internal/keylock"
	"crust.dev/crust/internal/metrics"
	"crust.dev/crust/internal/recordfile"
	"crust.dev/crust/pkg/command"
)

// Config is crust-csi-proxy's configuration; the flags of NewCommand fill it.
type Config struct {
	// Controller makes the proxy serve Identity and Controller in front of the driver's controller
	// socket (see controllerServer) instead of Identity and Node; it needs neither crustd nor state.
	Controller bool
	// CSIAddress is the unix socket the proxy serves (the one kubelet dials): a path or unix:// address.
	CSIAddress string
	// DriverAddress is the driver's unix socket.
	DriverAddress string
	// CrustSocket is crustd's API socket.
	CrustSocket string
	// MicroVMHandlers are the patterns (client.ParseHandlers) of the runtime handlers whose pods get deferred
	// volumes (with Kubeconfig).
	MicroVMHandlers []string
	// DefaultHandler is the node runtime's handler for pods that name no RuntimeClass (containerd's
	// default_runtime_name); "" means runc, whose pods' volumes are mounted on the host. A node whose
	// default runtime is a microVM's (every pod in a VM) sets it, with Kubeconfig.
	DefaultHandler string
	// Kubeconfig, when set, turns on pod look-ups; empty means: defer whenever the volume context asks.
	Kubeconfig string
	// StateDir holds the proxy's records and private block paths.
	StateDir string
	// KubeletDir is kubelet's root directory, which holds the quarantine (QuarantineDir).
	KubeletDir string
	// QuarantineMaxAge and QuarantineMaxBytes bound the quarantine (see pruneQuarantine); 0 is no bound.
	QuarantineMaxAge   time.Duration
	QuarantineMaxBytes int64
	// StageKeyDir keeps the encryption keys of stages on tmpfs (see stageKeys); "" is a directory of the
	// proxy's own beside crustd's socket.
	StageKeyDir string
	// NodeName restricts the pod informer to this node (needed with Kubeconfig).
	NodeName string
	// PodWait is how long a publish waits for a pod to appear in the cache before UNAVAILABLE.
	PodWait time.Duration
	// LockWait is how long a call waits for another on the same path before ABORTED.
	LockWait time.Duration
	// GuardTargets mounts an empty read-only tmpfs on a deferred volume's target, for a pod the cache
	// holds with no subPath, so that a runtime that uses the target instead of claiming the volume fails
	// to write (see guardTarget).
	GuardTargets bool
	// UnconsumedInterval is how often the proxy looks for deferred volumes no sandbox has claimed while
	// their pod runs (with pod look-ups; 0: never); UnconsumedGrace is how long after its publish such a
	// volume is not yet reported.
	UnconsumedInterval, UnconsumedGrace time.Duration
	// HTTPAddr serves /metrics, /healthz and /readyz; "" serves nothing.
	HTTPAddr string
	// MetricsSecure is the authenticated /metrics endpoint (off by default).
	MetricsSecure metrics.Secure
}

// DefaultStateDir lies under kubelet's root on purpose: a containerised driver sees (and mounts with
// bidirectional propagation) only that tree, and the driver must be able to publish to the proxy's
// private block paths.
const DefaultStateDir = "/var/lib/kubelet/plugins/crust.dev/csi-proxy"

// Defaults returns the defaults of the flags.
func Defaults() Config {
	return Config{
		CrustSocket: crustd.DefaultSocket,
		StateDir:    DefaultStateDir,
		KubeletDir:  "/var/lib/kubelet",
		// A week to recover what a pod wrote, and 1 GiB of the node's disk at most.
		QuarantineMaxAge: 7 * 24 * time.Hour, QuarantineMaxBytes: 1 << 30,
		PodWait:  2 * time.Second,
		LockWait: 5 * time.Second,
		// The deferred targets' guard and the check for unconsumed volumes (guard.go, consume.go).
		GuardTargets:       true,
		UnconsumedInterval: 30 * time.Second,
		UnconsumedGrace:    2 * time.Minute,
	}
}

// Proxy is the CSI Identity and Node service in front of a driver. Create it with New.
type Proxy struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedNodeServer

	cfg      Config
	log      *slog.Logger
	driver   *grpc.ClientConn
	ident    csi.IdentityClient
	node     csi.NodeClient
	crust    *client.Client
	journal  Journal
	locks    *keylock.Locker
	pods     PodSource
	classes  ClassSource          // nil without --kubeconfig
	events   record.EventRecorder // nil without --kubeconfig
	deferral client.Deferral
	// stageKeys are the encryption keys NodeStageVolume gave, for the publishes that follow.
	stageKeys *stageKeys
	mounter   *mount.SafeFormatAndMount
	resizer   *mount.ResizeFs
	codec     rawCodec
	metrics   *metrics.Metrics
	caps      driverCaps
	consume   consumeCheck

	pruneMu sync.Mutex // one pruneQuarantine at a time

	nameMu     sync.Mutex
	driverName string
}

// Deps are the parts New would otherwise build from Config; a nil field is built as Config says.
type Deps struct {
	// Pods answers pod and RuntimeClass look-ups. Nil: informers on Clientset, or on Config.Kubeconfig's
	// cluster, or no look-ups at all when there is neither.
	Pods PodSource
	// Clientset is the API client for the informers and Events. Nil: built from Config.Kubeconfig.
	Clientset kubernetes.Interface
	// Journal records how far each call got. Nil: the record directory Config.StateDir, opened with this
	// boot's id.
	Journal Journal
	// DialOptions are added to those of the connections to the driver and to crustd (interceptors, say).
	DialOptions []grpc.DialOption
}

// New connects to the driver and crustd (lazily: neither needs to be up yet), opens the journal and, with
// a kubeconfig or a clientset, starts the pod and RuntimeClass informers, which run until ctx ends. The
// proxy owns deps.Journal from then on: Close closes it.
func New(ctx context.Context, cfg Config, log *slog.Logger, deps Deps) (*Proxy, error) {
	if cfg.DriverAddress == "" {
		return nil, errors.New("--driver-address is required")
	}
	if log == nil {
		log = slog.Default()
	}
	if cfg.Controller {
		p := &Proxy{cfg: cfg, log: log, codec: newRawCodec(), metrics: metrics.New()}
		var err error
		if p.driver, err = unixsocket.Dial(cfg.DriverAddress, nil, deps.DialOptions...); err != nil {
			return nil, fmt.Errorf("--driver-address: %w", err)
		}
		p.ident = csi.NewIdentityClient(p.driver)
		return p, nil
	}
	if cfg.CrustSocket == "" {
		return nil, errors.New("--crust-socket is required")
	}
	if cfg.StateDir == "" && deps.Journal == nil {
		return nil, errors.New("--state-dir is required")
	}
	handlers, err := client.ParseHandlers(cfg.MicroVMHandlers)
	if err != nil {
		return nil, fmt.Errorf("--microvm-handlers: %w", err)
	}
	p := &Proxy{
		cfg: cfg, log: log, codec: newRawCodec(), pods: deps.Pods, journal: deps.Journal,
		locks:   keylock.New(cfg.LockWait),
		metrics: metrics.New(),
		mounter: mount.NewSafeFormatAndMount(mount.New(""), utilexec.New()),
		resizer: mount.NewResizeFs(utilexec.New()),
	}
	cs := deps.Clientset
	if p.pods == nil && (cs != nil || cfg.Kubeconfig != "") {
		if len(handlers) == 0 {
			return nil, errors.New("--kubeconfig needs --microvm-handlers: without them no pod would get a deferred volume")
		}
		if cfg.NodeName == "" {
			return nil, errors.New("--kubeconfig needs --node-name (or $NODE_NAME)")
		}
		if cs == nil {
			if cs, err = kubeClient(cfg.Kubeconfig); err != nil {
				return nil, err
			}
		}
		ip, err := newInformerPods(ctx, cs, cfg.NodeName)
		if err != nil {
			return nil, err
		}
		p.pods, p.classes = ip, ip
		p.events = newRecorder(ctx, cs, cfg.NodeName)
	}
	p.deferral = deferral(p.pods, handlers, cfg.DefaultHandler, cfg.PodWait)
	bootID, err := recordfile.ReadBootID()
	if err != nil {
		return nil, err
	}
	if p.journal == nil {
		if p.journal, err = OpenJournal(cfg.StateDir, bootID, log); err != nil {
			return nil, err
		}
	}
	keyDir := cfg.StageKeyDir
	if keyDir == "" {
		keyDir = defaultStageKeyDir(cfg.CrustSocket, cfg.StateDir)
	}
	if p.stageKeys, err = openStageKeys(keyDir, bootID, log); err != nil {
		p.journal.Close()
		return nil, err
	}
	if p.driver, err = unixsocket.Dial(cfg.DriverAddress, nil, deps.DialOptions...); err != nil {
		return nil, fmt.Errorf("--driver-address: %w", err)
	}
	if p.crust, err = client.New(cfg.CrustSocket, client.WithDialOptions(deps.DialOptions...)); err != nil {
		_ = p.driver.Close()
		return nil, fmt.Errorf("--crust-socket: %w", err)
	}
	p.ident, p.node = csi.NewIdentityClient(p.driver), csi.NewNodeClient(p.driver)
	for _, r := range p.journal.List() {
		log.Info("state: record", "kind", r.Kind, "path", r.Path, "mode", r.Mode, "phase", r.Phase, "stale", r.Stale)
	}
	return p, nil
}

// Close closes the connections to the driver and crustd.
func (p *Proxy) Close() {
	_ = p.driver.Close()
	if p.crust != nil {
		_ = p.crust.Close()
	}
	if p.journal != nil {
		p.journal.Close()
	}
	if p.stageKeys != nil {
		p.stageKeys.close()
	}
}

// NewServer returns a gRPC server serving the proxy: Identity and Node typed, everything else forwarded
// raw, all of it through the counting and logging interceptors.
func (p *Proxy) NewServer() *grpc.Server {
	calls := callLog(p.log)
	s := grpc.NewServer(
		grpc.ForceServerCodecV2(p.codec),
		command.StreamWorkers(),
		grpc.UnknownServiceHandler(p.forwardUnknown),
		grpc.ChainUnaryInterceptor(p.metrics.UnaryServerInterceptor(), calls.Unary(), errdefs.UnaryServerInterceptor),
		grpc.ChainStreamInterceptor(p.metrics.StreamServerInterceptor(), calls.Stream(), errdefs.StreamServerInterceptor),
	)
	csi.RegisterIdentityServer(s, p)
	if p.cfg.Controller {
		s.RegisterService(controllerServiceDesc(), &controllerServer{ctrl: csi.NewControllerClient(p.driver)})
	} else {
		s.RegisterService(nodeServiceDesc(), p)
	}
	return s
}

// Run serves cfg.CSIAddress until ctx ends, then stops gracefully.
func Run(ctx context.Context, cfg Config, log *slog.Logger, deps Deps) error {
	if cfg.CSIAddress == "" {
		return errors.New("--csi-address is required")
	}
	p, err := New(ctx, cfg, log, deps)
	if err != nil {
		return err
	}
	defer p.Close()
	stopCheck := p.startConsumeCheck(ctx)
	defer stopCheck()
	if !cfg.Controller {
		stopReconcile := p.startReconcile(ctx)
		defer stopReconcile()
		stopPrune := p.startPrune(ctx)
		defer stopPrune()
	}
	if ip, ok := p.pods.(*informerPods); ok {
		go func() {
			if ip.waitSynced(ctx) {
				log.Info("pod and RuntimeClass caches synced", "node", cfg.NodeName)
			}
		}()
	}
	lis, err := unixsocket.Listen(cfg.CSIAddress)
	if err != nil {
		return fmt.Errorf("listen on --csi-address %s: %w", cfg.CSIAddress, err)
	}
	// Every listener is bound before any is served, so that an answer on one means the others listen.
	errc := make(chan error, 3)
	stopHTTP, err := p.metrics.Serve(cfg.HTTPAddr, cfg.MetricsSecure, log, errc)
	if err != nil {
		_ = lis.Close()
		return err
	}
	defer stopHTTP()
	srv := p.NewServer()
	go func() { errc <- srv.Serve(lis) }()
	p.metrics.SetReady(true)
	if cfg.Controller {
		log.Info("serving the controller", "csi_address", cfg.CSIAddress, "driver_address", cfg.DriverAddress)
	} else {
		log.Info("serving", "csi_address", cfg.CSIAddress, "driver_address", cfg.DriverAddress,
			"crust_socket", cfg.CrustSocket, "microvm_handlers", cfg.MicroVMHandlers, "default_runtime_handler", cfg.DefaultHandler, "pod_lookups", p.pods != nil)
	}
	select {
	case err = <-errc:
	case <-ctx.Done():
	}
	p.metrics.SetReady(false)
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		srv.Stop()
	}
	return err
}

// ---- Identity: pass-through ----

// GetPluginInfo forwards to the driver.
func (p *Proxy) GetPluginInfo(ctx context.Context, r *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return p.ident.GetPluginInfo(outgoing(ctx), r)
}

// GetPluginCapabilities forwards to the driver.
func (p *Proxy) GetPluginCapabilities(ctx context.Context, r *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return p.ident.GetPluginCapabilities(outgoing(ctx), r)
}

// Probe forwards to the driver.
func (p *Proxy) Probe(ctx context.Context, r *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return p.ident.Probe(outgoing(ctx), r)
}

// ---- Node: pass-through ----

// NodeGetInfo forwards to the driver.
func (p *Proxy) NodeGetInfo(ctx context.Context, r *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return p.node.NodeGetInfo(outgoing(ctx), r)
}

// NodeGetStorageHealth forwards to the driver.
func (p *Proxy) NodeGetStorageHealth(ctx context.Context, r *csi.NodeGetStorageHealthRequest) (*csi.NodeGetStorageHealthResponse, error) {
	return p.node.NodeGetStorageHealth(outgoing(ctx), r)
}

// ---- helpers ----

// blockCapability returns c with its access type replaced by Block (same access mode); nil for nil.
func blockCapability(c *csi.VolumeCapability) *csi.VolumeCapability {
	if c == nil {
		return nil
	}
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: proto.Clone(c.GetAccessMode()).(*csi.VolumeCapability_AccessMode),
	}
}

// isFinal reports whether kubelet takes err as final, that is, it will not treat the volume as possibly
// published and so will not call NodeUnpublishVolume or NodeUnstageVolume for it: every kind but those of
// a call that may still be going on or may succeed when retried.
func isFinal(err error) bool {
	for _, kind := range []error{context.Canceled, context.DeadlineExceeded, errdefs.ErrUnavailable, errdefs.ErrResourceExhausted, errdefs.ErrAborted} {
		if errors.Is(err, kind) {
			return false
		}
	}
	return err != nil
}

// lock takes path's lock, or fails with ABORTED.
func (p *Proxy) lock(ctx context.Context, path string) (func(), error) {
	unlock, err := p.locks.Lock(ctx, path)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.ErrAborted, "an operation on %s is in flight", path)
	}
	return unlock, nil
}

// lockRecord takes path's lock, or fails with ABORTED, and returns path's record of kind k as the journal
// holds it under that lock (nil when none). The caller calls unlock when done, whether or not there is a
// record.
func (p *Proxy) lockRecord(ctx context.Context, k Kind, path string) (rec *Record, unlock func(), err error) {
	unlock, err = p.lock(ctx, path)
	if err != nil {
		return nil, nil, err
	}
	return p.journal.Get(k, path), unlock, nil
}

// put records r at phase ph.
func (p *Proxy) put(r *Record, ph Phase) error {
	r.Phase = ph
	if err := p.journal.Put(r); err != nil {
		return errdefs.Errorf(errdefs.ErrInternal, "recording %s of %s: %v", ph, r.Path, err)
	}
	return nil
}

// driverNameFor returns the driver's name from GetPluginInfo, cached once known; "" when unknown.
func (p *Proxy) driverNameFor(ctx context.Context) string {
	p.nameMu.Lock()
	defer p.nameMu.Unlock()
	if p.driverName == "" {
		if r, err := p.ident.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{}); err == nil {
			p.driverName = r.GetName()
		}
	}
	return p.driverName
}
