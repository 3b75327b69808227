package co

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"crust.dev/crust/api/unixsocket"
	"crust.dev/crust/api/volume"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"crust.dev/crust/pkg/fsgroup"
)

// DefaultHandler is the runtime handler of a pod without a RuntimeClass.
const DefaultHandler = "runc"

// Volume context and parameter keys the simulator reads or writes.
const (
	// FSTypeKey is the StorageClass parameter naming the filesystem type.
	FSTypeKey = "csi.storage.k8s.io/fstype"
	// ReservedPrefix marks StorageClass parameters meant for the provisioner, not the driver.
	ReservedPrefix = "csi.storage.k8s.io/"
	// ProvisionerIdentityKey is the volume attribute external-provisioner adds to every PV it makes.
	ProvisionerIdentityKey = "storage.kubernetes.io/csiProvisionerIdentity"
	// PVCNameKey, PVCNamespaceKey and PVNameKey are added to CreateVolume's parameters with
	// DriverConfig.ExtraCreateMetadata.
	PVCNameKey      = "csi.storage.k8s.io/pvc/name"
	PVCNamespaceKey = "csi.storage.k8s.io/pvc/namespace"
	PVNameKey       = "csi.storage.k8s.io/pv/name"
)

// Config describes the simulated node.
type Config struct {
	// NodeName is the node's name; "node-1" when empty.
	NodeName string
	// KubeletDir is kubelet's root directory (its --root-dir); it is made when missing.
	KubeletDir string
	// RuntimeClasses maps a RuntimeClass name to its runtime handler.
	RuntimeClasses map[string]string
	// Runtimes maps a runtime handler to the runtime that runs its pods; DefaultHandler serves pods
	// without a RuntimeClass.
	Runtimes map[string]Runtime
	// API, when set, holds the node's pods while they exist and the RuntimeClasses.
	API *APIServer
	// RetryFor bounds the retries of a call that fails with a code kubelet retries on; 30 s when zero.
	RetryFor time.Duration
	// Logf, when set, gets one line per CSI call (testing.T.Logf fits).
	Logf func(format string, args ...any)
}

// CO is one simulated node with its kubelet, plus the cluster-level sidecars of the drivers registered
// with it. Its methods may be called from several goroutines.
type CO struct {
	cfg Config

	mu       sync.Mutex
	drivers  map[string]*Driver
	calls    []Call
	attached map[string]map[string]string // volume key -> publish_context
	staged   map[string]*stagedVolume     // volume key -> its staging
	pods     map[string]*RunningPod       // pod UID -> pod
}

// stagedVolume is a volume staged on the node and the pods that use it.
type stagedVolume struct {
	path  string
	users map[string]bool
}

// New returns a simulator for cfg's node and registers cfg.RuntimeClasses with cfg.API.
func New(cfg Config) (*CO, error) {
	if cfg.KubeletDir == "" || !filepath.IsAbs(cfg.KubeletDir) {
		return nil, errors.New("co: Config.KubeletDir must be an absolute path")
	}
	if cfg.NodeName == "" {
		cfg.NodeName = "node-1"
	}
	if cfg.RetryFor <= 0 {
		cfg.RetryFor = 30 * time.Second
	}
	if err := os.MkdirAll(filepath.Join(cfg.KubeletDir, "pods"), 0o750); err != nil {
		return nil, err
	}
	if cfg.API != nil {
		for name, handler := range cfg.RuntimeClasses {
			cfg.API.PutRuntimeClass(name, handler)
		}
	}
	return &CO{
		cfg: cfg, drivers: map[string]*Driver{}, attached: map[string]map[string]string{},
		staged: map[string]*stagedVolume{}, pods: map[string]*RunningPod{},
	}, nil
}

// NodeName is the simulated node's name.
func (c *CO) NodeName() string { return c.cfg.NodeName }

// Call is one CSI call as the driver received it.
type Call struct {
	Driver   string // the driver's name ("" before GetPluginInfo answered)
	Endpoint string
	Method   string        // short name, such as NodeStageVolume
	Request  proto.Message // a copy
	Response proto.Message // a copy; nil on error
	Err      error
	Duration time.Duration
}

// Calls returns every CSI call made so far, retries included, in order.
func (c *CO) Calls() []Call {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.calls)
}

// --- drivers ---

// FSGroupPolicy is a CSIDriver's spec.fsGroupPolicy.
type FSGroupPolicy string

// FSGroupPolicy values.
const (
	FSGroupPolicyReadWriteOnceWithFSType FSGroupPolicy = "ReadWriteOnceWithFSType"
	FSGroupPolicyFile                    FSGroupPolicy = "File"
	FSGroupPolicyNone                    FSGroupPolicy = "None"
)

// DriverConfig is a driver's deployment: its sockets and its CSIDriver object.
type DriverConfig struct {
	// NodeEndpoint is the unix socket kubelet dials (the node plugin's, or a proxy's in front of it).
	NodeEndpoint string
	// ControllerEndpoint is the unix socket the controller sidecars dial; NodeEndpoint when empty.
	ControllerEndpoint string
	// PodInfoOnMount is the CSIDriver's spec.podInfoOnMount.
	PodInfoOnMount bool
	// FSGroupPolicy is the CSIDriver's spec.fsGroupPolicy; ReadWriteOnceWithFSType when empty.
	FSGroupPolicy FSGroupPolicy
	// ExtraCreateMetadata is external-provisioner's --extra-create-metadata.
	ExtraCreateMetadata bool
}

// Driver is a registered CSI driver.
type Driver struct {
	// Name is the driver's name (GetPluginInfo); NodeID its id for this node (NodeGetInfo).
	Name, NodeID string

	co         *CO
	cfg        DriverConfig
	conns      []*grpc.ClientConn
	node       csi.NodeClient
	controller csi.ControllerClient // nil without the CONTROLLER_SERVICE plugin capability
	ctrlCaps   map[csi.ControllerServiceCapability_RPC_Type]bool

	nameMu sync.Mutex
}

// RegisterDriver registers a driver as node-driver-registrar and kubelet do (GetPluginInfo, then
// NodeGetInfo, on the node socket) and readies its controller side as external-provisioner does (Probe
// until ready, GetPluginCapabilities, ControllerGetCapabilities). Sockets that do not exist yet are
// waited for (Config.RetryFor).
func (c *CO) RegisterDriver(ctx context.Context, cfg DriverConfig) (*Driver, error) {
	if cfg.NodeEndpoint == "" {
		return nil, errors.New("co: DriverConfig.NodeEndpoint is required")
	}
	if cfg.ControllerEndpoint == "" {
		cfg.ControllerEndpoint = cfg.NodeEndpoint
	}
	if cfg.FSGroupPolicy == "" {
		cfg.FSGroupPolicy = FSGroupPolicyReadWriteOnceWithFSType
	}
	d := &Driver{co: c, cfg: cfg, ctrlCaps: map[csi.ControllerServiceCapability_RPC_Type]bool{}}
	nodeConn, err := d.dial(cfg.NodeEndpoint)
	if err != nil {
		return nil, err
	}
	ctrlConn := nodeConn
	if cfg.ControllerEndpoint != cfg.NodeEndpoint {
		if ctrlConn, err = d.dial(cfg.ControllerEndpoint); err != nil {
			d.Close()
			return nil, err
		}
	}
	fail := func(what string, err error) (*Driver, error) {
		d.Close()
		return nil, fmt.Errorf("co: register %s: %s: %w", cfg.NodeEndpoint, what, err)
	}
	info, err := csi.NewIdentityClient(nodeConn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil {
		return fail("GetPluginInfo", err)
	}
	d.nameMu.Lock()
	d.Name = info.GetName()
	d.nameMu.Unlock()
	d.node = csi.NewNodeClient(nodeConn)
	ni, err := d.node.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil {
		return fail("NodeGetInfo", err)
	}
	d.NodeID = ni.GetNodeId()

	ident := csi.NewIdentityClient(ctrlConn)
	for {
		r, err := ident.Probe(ctx, &csi.ProbeRequest{})
		if err != nil {
			return fail("Probe", err)
		}
		if r.GetReady() == nil || r.GetReady().GetValue() {
			break
		}
		select {
		case <-ctx.Done():
			return fail("Probe", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	pc, err := ident.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	if err != nil {
		return fail("GetPluginCapabilities", err)
	}
	for _, cp := range pc.GetCapabilities() {
		if cp.GetService().GetType() == csi.PluginCapability_Service_CONTROLLER_SERVICE {
			d.controller = csi.NewControllerClient(ctrlConn)
		}
	}
	if d.controller != nil {
		cc, err := d.controller.ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
		if err != nil {
			return fail("ControllerGetCapabilities", err)
		}
		for _, cp := range cc.GetCapabilities() {
			d.ctrlCaps[cp.GetRpc().GetType()] = true
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, dup := c.drivers[d.Name]; dup {
		d.Close()
		return nil, fmt.Errorf("co: a driver named %q is registered already", d.Name)
	}
	c.drivers[d.Name] = d
	return d, nil
}

// Close closes the driver's connections.
func (d *Driver) Close() {
	for _, cc := range d.conns {
		_ = cc.Close()
	}
}

func (d *Driver) name() string {
	d.nameMu.Lock()
	defer d.nameMu.Unlock()
	return d.Name
}

func (d *Driver) dial(endpoint string) (*grpc.ClientConn, error) {
	cc, err := unixsocket.Dial(endpoint, nil, grpc.WithChainUnaryInterceptor(d.intercept(endpoint)))
	if err != nil {
		return nil, fmt.Errorf("co: dial %s: %w", endpoint, err)
	}
	d.conns = append(d.conns, cc)
	return cc, nil
}

// noRetry are the calls kubelet does not retry at once (the stats collector asks again next period).
var noRetry = map[string]bool{"NodeGetVolumeStats": true, "NodeGetVolumeHealth": true, "Probe": true}

// intercept records every call and retries those that fail with UNAVAILABLE, ABORTED or
// DEADLINE_EXCEEDED, with backoff, for Config.RetryFor.
func (d *Driver) intercept(endpoint string) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		short := method[strings.LastIndexByte(method, '/')+1:]
		deadline := time.Now().Add(d.co.cfg.RetryFor)
		backoff := 50 * time.Millisecond
		for {
			start := time.Now()
			err := invoker(ctx, method, req, reply, cc, opts...)
			call := Call{Driver: d.name(), Endpoint: endpoint, Method: short, Err: err, Duration: time.Since(start)}
			if m, ok := req.(proto.Message); ok {
				call.Request = proto.Clone(m)
			}
			if m, ok := reply.(proto.Message); ok && err == nil {
				call.Response = proto.Clone(m)
			}
			d.co.record(call)
			switch status.Code(err) {
			case codes.Unavailable, codes.Aborted, codes.DeadlineExceeded:
			default:
				return err
			}
			if noRetry[short] || time.Now().Add(backoff).After(deadline) {
				return err
			}
			select {
			case <-ctx.Done():
				return err
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
		}
	}
}

func (c *CO) record(call Call) {
	c.mu.Lock()
	c.calls = append(c.calls, call)
	c.mu.Unlock()
	if c.cfg.Logf != nil {
		if call.Err != nil {
			c.cfg.Logf("csi %s %s: %s", call.Driver, call.Method, status.Convert(call.Err).Message())
		} else {
			c.cfg.Logf("csi %s %s: OK (%s)", call.Driver, call.Method, call.Duration.Round(time.Millisecond))
		}
	}
}

// nodeCaps asks NodeGetCapabilities, as kubelet does before each operation.
func (d *Driver) nodeCaps(ctx context.Context) (map[csi.NodeServiceCapability_RPC_Type]bool, error) {
	r, err := d.node.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
	if err != nil {
		return nil, err
	}
	caps := map[csi.NodeServiceCapability_RPC_Type]bool{}
	for _, cp := range r.GetCapabilities() {
		caps[cp.GetRpc().GetType()] = true
	}
	return caps, nil
}

// --- volumes ---

// StorageClass is what CreateVolume is made from.
type StorageClass struct {
	Driver       *Driver
	Parameters   map[string]string
	MountOptions []string
}

// Claim is a PersistentVolumeClaim.
type Claim struct {
	Namespace, Name string
	// UID is the claim's UID; a random one when empty. The volume is named pvc-<UID>.
	UID string
	// Size is the requested storage in bytes.
	Size int64
	// AccessMode is the CSI access mode of the claim's access mode; SINGLE_NODE_WRITER
	// (ReadWriteOnce) when unset.
	AccessMode csi.VolumeCapability_AccessMode_Mode
}

// Volume is a PersistentVolume provisioned by a driver.
type Volume struct {
	// Name is the PV's name (pvc-<claim UID>), Handle its spec.csi.volumeHandle.
	Name, Handle string
	Driver       *Driver
	// FSType is spec.csi.fsType, MountOptions spec.mountOptions.
	FSType       string
	MountOptions []string
	// Attributes is spec.csi.volumeAttributes: the driver's volume_context and the provisioner's identity.
	Attributes map[string]string
	// Capacity is spec.capacity in bytes.
	Capacity   int64
	AccessMode csi.VolumeCapability_AccessMode_Mode

	pendingNodeExpansion bool // guarded by co.mu
}

func (v *Volume) key() string { return v.Driver.name() + "/" + v.Handle }

// capability is the volume's capability as kubelet and the sidecars send it, with fsGroup as
// volume_mount_group when group is not empty.
func (v *Volume) capability(group string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{
			FsType: v.FSType, MountFlags: slices.Clone(v.MountOptions), VolumeMountGroup: group,
		}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: v.AccessMode},
	}
}

// Provision makes a volume for claim as external-provisioner does with sc.
func (c *CO) Provision(ctx context.Context, sc StorageClass, claim Claim) (*Volume, error) {
	d := sc.Driver
	if d == nil || d.controller == nil || !d.ctrlCaps[csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME] {
		return nil, errors.New("co: the StorageClass's driver cannot provision (no CREATE_DELETE_VOLUME)")
	}
	if claim.UID == "" {
		claim.UID = NewUID()
	}
	if claim.AccessMode == csi.VolumeCapability_AccessMode_UNKNOWN {
		claim.AccessMode = csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	}
	v := &Volume{
		Name: "pvc-" + claim.UID, Driver: d, FSType: sc.Parameters[FSTypeKey],
		MountOptions: slices.Clone(sc.MountOptions), AccessMode: claim.AccessMode,
	}
	params := map[string]string{}
	for k, val := range sc.Parameters {
		if !strings.HasPrefix(k, ReservedPrefix) {
			params[k] = val
		}
	}
	if d.cfg.ExtraCreateMetadata {
		params[PVCNameKey], params[PVCNamespaceKey], params[PVNameKey] = claim.Name, claim.Namespace, v.Name
	}
	r, err := d.controller.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:               v.Name,
		CapacityRange:      &csi.CapacityRange{RequiredBytes: claim.Size},
		VolumeCapabilities: []*csi.VolumeCapability{v.capability("")},
		Parameters:         params,
	})
	if err != nil {
		return nil, fmt.Errorf("co: CreateVolume %s: %w", v.Name, err)
	}
	v.Handle = r.GetVolume().GetVolumeId()
	v.Capacity = r.GetVolume().GetCapacityBytes()
	if v.Capacity == 0 {
		v.Capacity = claim.Size
	}
	v.Attributes = map[string]string{}
	for k, val := range r.GetVolume().GetVolumeContext() {
		v.Attributes[k] = val
	}
	v.Attributes[ProvisionerIdentityKey] = fmt.Sprintf("%d-%d-%s", time.Now().UnixMilli(), mathrand.IntN(10000), d.name())
	return v, nil
}

// Delete deletes a volume no pod on the node uses any more, as external-provisioner does for reclaim
// policy Delete.
func (c *CO) Delete(ctx context.Context, v *Volume) error {
	c.mu.Lock()
	_, staged := c.staged[v.key()]
	_, attached := c.attached[v.key()]
	c.mu.Unlock()
	if staged || attached {
		return fmt.Errorf("co: volume %s is still in use on the node", v.Name)
	}
	if _, err := v.Driver.controller.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.Handle}); err != nil {
		return fmt.Errorf("co: DeleteVolume %s: %w", v.Name, err)
	}
	return nil
}

// ExpandResult is what an expansion did.
type ExpandResult struct {
	// Capacity is the PV's new capacity (ControllerExpandVolume's answer).
	Capacity int64
	// NodeExpanded says whether NodeExpandVolume ran; NodeCapacity is its answer.
	NodeExpanded bool
	NodeCapacity int64
	// NodePending says the node expansion waits for the volume's next publish.
	NodePending bool
}

// Expand grows v to size bytes as external-resizer and kubelet do: ControllerExpandVolume, then, when
// needed, NodeExpandVolume online on one pod's target path (or after the next publish).
func (c *CO) Expand(ctx context.Context, v *Volume, size int64) (ExpandResult, error) {
	d := v.Driver
	var res ExpandResult
	nodeNeeded := true
	if d.controller != nil && d.ctrlCaps[csi.ControllerServiceCapability_RPC_EXPAND_VOLUME] {
		r, err := d.controller.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{
			VolumeId: v.Handle, CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapability: v.capability(""),
		})
		if err != nil {
			return res, fmt.Errorf("co: ControllerExpandVolume %s: %w", v.Name, err)
		}
		v.Capacity = max(r.GetCapacityBytes(), size)
		nodeNeeded = r.GetNodeExpansionRequired()
	} else {
		v.Capacity = size
	}
	res.Capacity = v.Capacity
	if !nodeNeeded {
		return res, nil
	}
	rp := c.publishedIn(v)
	if rp == nil {
		c.mu.Lock()
		v.pendingNodeExpansion = true
		c.mu.Unlock()
		res.NodePending = true
		return res, nil
	}
	capacity, done, err := c.nodeExpand(ctx, rp, v)
	res.NodeExpanded, res.NodeCapacity = done, capacity
	return res, err
}

// publishedIn returns a running pod that has v published.
func (c *CO) publishedIn(v *Volume) *RunningPod {
	c.mu.Lock()
	defer c.mu.Unlock()
	uids := make([]string, 0, len(c.pods))
	for uid := range c.pods {
		uids = append(uids, uid)
	}
	slices.Sort(uids)
	for _, uid := range uids {
		rp := c.pods[uid]
		for _, pv := range rp.vols {
			if pv.Volume == v && pv.published {
				return rp
			}
		}
	}
	return nil
}

func (c *CO) nodeExpand(ctx context.Context, rp *RunningPod, v *Volume) (int64, bool, error) {
	d := v.Driver
	caps, err := d.nodeCaps(ctx)
	if err != nil {
		return 0, false, err
	}
	c.mu.Lock()
	v.pendingNodeExpansion = false
	c.mu.Unlock()
	if !caps[csi.NodeServiceCapability_RPC_EXPAND_VOLUME] {
		return 0, false, nil
	}
	req := &csi.NodeExpandVolumeRequest{
		VolumeId: v.Handle, VolumePath: rp.TargetPath(v),
		CapacityRange: &csi.CapacityRange{RequiredBytes: v.Capacity}, VolumeCapability: v.capability(""),
	}
	if caps[csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME] {
		req.StagingTargetPath = c.StagingPath(v)
	}
	r, err := d.node.NodeExpandVolume(ctx, req)
	if err != nil {
		c.mu.Lock()
		v.pendingNodeExpansion = true
		c.mu.Unlock()
		return 0, false, fmt.Errorf("co: NodeExpandVolume %s: %w", v.Name, err)
	}
	return r.GetCapacityBytes(), true, nil
}

// --- paths ---

// StagingPath is kubelet's staging path of v on this node.
func (c *CO) StagingPath(v *Volume) string {
	sum := sha256.Sum256([]byte(v.Handle))
	return filepath.Join(c.cfg.KubeletDir, "plugins", "kubernetes.io", "csi", v.Driver.name(), hex.EncodeToString(sum[:]), "globalmount")
}

// PodDir is kubelet's directory of a pod.
func (c *CO) PodDir(podUID string) string { return filepath.Join(c.cfg.KubeletDir, "pods", podUID) }

// TargetPath is kubelet's publish target path of v for a pod.
func (c *CO) TargetPath(podUID string, v *Volume) string {
	return filepath.Join(c.PodDir(podUID), "volumes", "kubernetes.io~csi", v.Name, "mount")
}

// attachmentID is the VolumeAttachment's name for v on this node.
func (c *CO) attachmentID(v *Volume) string {
	sum := sha256.Sum256([]byte(v.Handle + v.Driver.name() + c.cfg.NodeName))
	return "csi-" + hex.EncodeToString(sum[:])
}

// writeVolData writes kubelet's vol_data.json into dir.
func writeVolData(dir string, data map[string]string) error {
	b, err := json.Marshal(data)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "vol_data.json"), b, 0o640)
}

// NewUID returns a random UUID (version 4), as the API server gives objects.
func NewUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// --- pods ---

// Pod is a pod bound to the simulated node.
type Pod struct {
	Namespace, Name string
	// UID is the pod's UID; a random one when empty.
	UID string
	// ServiceAccount is spec.serviceAccountName; "default" when empty.
	ServiceAccount string
	// RuntimeClassName is spec.runtimeClassName; empty runs the pod under DefaultHandler.
	RuntimeClassName string
	// FSGroup is spec.securityContext.fsGroup.
	FSGroup *int64
	Volumes []PodVolume
}

// PodVolume is a volume of a pod: a PVC bound to Volume, mounted in the container at MountPath.
type PodVolume struct {
	Volume    *Volume
	MountPath string
	// ReadOnly is the pod's persistentVolumeClaim.readOnly.
	ReadOnly bool
}

// RunningPod is a pod whose volumes were set up and whose runtime was started.
type RunningPod struct {
	Pod *Pod
	// Handler is the runtime handler the pod runs under.
	Handler string
	// Sandbox is what the runtime started; nil when the pod did not get that far.
	Sandbox Sandbox

	co   *CO
	vols []*podVolumeState
}

type podVolumeState struct {
	PodVolume
	attached, staged, published bool
}

// TargetPath is v's publish target path for this pod.
func (rp *RunningPod) TargetPath(v *Volume) string { return rp.co.TargetPath(rp.Pod.UID, v) }

// RunPod admits pod on the node as kubelet does: the pod object is put in the API server, each volume
// is attached (when the driver has ControllerPublishVolume), staged (once per node) and published, then
// the runtime of the pod's RuntimeClass handler starts it with the target paths. When it fails part way,
// the RunningPod returned with the error holds what was done, and StopPod undoes it.
func (c *CO) RunPod(ctx context.Context, pod *Pod) (*RunningPod, error) {
	if pod.UID == "" {
		pod.UID = NewUID()
	}
	handler := DefaultHandler
	if pod.RuntimeClassName != "" {
		h, ok := c.cfg.RuntimeClasses[pod.RuntimeClassName]
		if !ok {
			return nil, fmt.Errorf("co: pod %s/%s: RuntimeClass %q not found", pod.Namespace, pod.Name, pod.RuntimeClassName)
		}
		handler = h
	}
	rt := c.cfg.Runtimes[handler]
	if rt == nil {
		return nil, fmt.Errorf("co: pod %s/%s: no runtime for handler %q", pod.Namespace, pod.Name, handler)
	}
	rp := &RunningPod{Pod: pod, Handler: handler, co: c}
	for _, v := range pod.Volumes {
		rp.vols = append(rp.vols, &podVolumeState{PodVolume: v})
	}
	c.mu.Lock()
	if _, dup := c.pods[pod.UID]; dup {
		c.mu.Unlock()
		return nil, fmt.Errorf("co: pod %s runs already", pod.UID)
	}
	c.pods[pod.UID] = rp
	c.mu.Unlock()
	if c.cfg.API != nil {
		c.cfg.API.putPod(pod, c.cfg.NodeName)
	}
	if err := os.MkdirAll(filepath.Join(c.PodDir(pod.UID), "volumes", "kubernetes.io~csi"), 0o750); err != nil {
		return rp, err
	}
	var mounts []Mount
	for _, pv := range rp.vols {
		if err := c.mountVolume(ctx, rp, pv); err != nil {
			return rp, fmt.Errorf("co: pod %s/%s, volume %s: %w", pod.Namespace, pod.Name, pv.Volume.Name, err)
		}
		mounts = append(mounts, Mount{HostPath: rp.TargetPath(pv.Volume), ContainerPath: pv.MountPath, ReadOnly: pv.ReadOnly})
	}
	sb, err := rt.Start(ctx, pod, mounts)
	if err != nil {
		return rp, fmt.Errorf("co: pod %s/%s: start under %s: %w", pod.Namespace, pod.Name, handler, err)
	}
	rp.Sandbox = sb
	return rp, nil
}

// podInfo is the volume context kubelet adds for podInfoOnMount.
func podInfo(pod *Pod) map[string]string {
	sa := pod.ServiceAccount
	if sa == "" {
		sa = "default"
	}
	return map[string]string{
		volume.PodNameKey: pod.Name, volume.PodNamespaceKey: pod.Namespace, volume.PodUIDKey: pod.UID,
		volume.ServiceAccountKey: sa, volume.EphemeralKey: "false",
	}
}

func (c *CO) mountVolume(ctx context.Context, rp *RunningPod, pv *podVolumeState) error {
	v, d, pod := pv.Volume, pv.Volume.Driver, rp.Pod
	key := v.key()

	// Attach.
	c.mu.Lock()
	pubCtx, attached := c.attached[key]
	c.mu.Unlock()
	if !attached && d.ctrlCaps[csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME] {
		r, err := d.controller.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{
			VolumeId: v.Handle, NodeId: d.NodeID, VolumeCapability: v.capability(""), VolumeContext: v.Attributes,
		})
		if err != nil {
			return fmt.Errorf("ControllerPublishVolume: %w", err)
		}
		pubCtx = r.GetPublishContext()
		c.mu.Lock()
		c.attached[key] = pubCtx
		c.mu.Unlock()
	}
	pv.attached = true

	// Stage.
	caps, err := d.nodeCaps(ctx)
	if err != nil {
		return err
	}
	group := ""
	if pod.FSGroup != nil && caps[csi.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP] {
		group = strconv.FormatInt(*pod.FSGroup, 10)
	}
	staging := ""
	if caps[csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME] {
		staging = c.StagingPath(v)
		c.mu.Lock()
		st := c.staged[key]
		c.mu.Unlock()
		if st == nil {
			if err := os.MkdirAll(staging, 0o750); err != nil {
				return err
			}
			if err := writeVolData(filepath.Dir(staging), map[string]string{"driverName": d.name(), "volumeHandle": v.Handle}); err != nil {
				return err
			}
			if _, err := d.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
				VolumeId: v.Handle, PublishContext: pubCtx, StagingTargetPath: staging,
				VolumeCapability: v.capability(group), VolumeContext: v.Attributes,
			}); err != nil {
				return fmt.Errorf("NodeStageVolume: %w", err)
			}
			st = &stagedVolume{path: staging, users: map[string]bool{}}
			c.mu.Lock()
			c.staged[key] = st
			c.mu.Unlock()
		}
		c.mu.Lock()
		st.users[pod.UID] = true
		c.mu.Unlock()
		pv.staged = true
	}

	// Publish (kubelet asks for the capabilities again in its mounter).
	if _, err := d.nodeCaps(ctx); err != nil {
		return err
	}
	target := rp.TargetPath(v)
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		return err
	}
	if err := writeVolData(filepath.Dir(target), map[string]string{
		"attachmentID": c.attachmentID(v), "driverName": d.name(), "nodeName": c.cfg.NodeName,
		"specVolID": v.Name, "volumeHandle": v.Handle, "volumeLifecycleMode": "Persistent",
	}); err != nil {
		return err
	}
	volCtx := map[string]string{}
	for k, val := range v.Attributes {
		volCtx[k] = val
	}
	if d.cfg.PodInfoOnMount {
		for k, val := range podInfo(pod) {
			volCtx[k] = val
		}
	}
	if _, err := d.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
		VolumeId: v.Handle, PublishContext: pubCtx, StagingTargetPath: staging, TargetPath: target,
		VolumeCapability: v.capability(group), Readonly: pv.ReadOnly, VolumeContext: volCtx,
	}); err != nil {
		pv.published = !final(err) // uncertain: kubelet unpublishes it at stop
		return fmt.Errorf("NodePublishVolume: %w", err)
	}
	pv.published = true

	// fsGroup, when not delegated to the driver.
	if pod.FSGroup != nil && group == "" && !pv.ReadOnly && c.ownershipApplies(d, v) {
		if err := fsgroup.Apply(target, int(*pod.FSGroup), fsgroup.Always); err != nil {
			return fmt.Errorf("fsGroup %d on %s: %w", *pod.FSGroup, target, err)
		}
	}

	// Node expansion left for the next publish.
	c.mu.Lock()
	pending := v.pendingNodeExpansion
	c.mu.Unlock()
	if pending {
		if _, _, err := c.nodeExpand(ctx, rp, v); err != nil {
			return err
		}
	}
	return nil
}

// final reports whether kubelet takes err as final (the operation did not happen), rather than as
// leaving the volume in an uncertain state that it must clean up.
func final(err error) bool {
	switch status.Code(err) {
	case codes.Canceled, codes.DeadlineExceeded, codes.Unavailable, codes.ResourceExhausted, codes.Aborted:
		return false
	}
	return true
}

func (c *CO) ownershipApplies(d *Driver, v *Volume) bool {
	switch d.cfg.FSGroupPolicy {
	case FSGroupPolicyFile:
		return true
	case FSGroupPolicyNone:
		return false
	default:
		return v.FSType != "" && v.AccessMode == csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	}
}

// StopPod stops a pod as kubelet does when it is deleted: the runtime first, then NodeUnpublishVolume
// of every volume, NodeUnstageVolume of those no other pod on the node uses, detach, the pod's
// directory, and last the pod object. A step that fails leaves the steps that depend on it undone; the
// error lists every failure.
func (c *CO) StopPod(ctx context.Context, rp *RunningPod) error {
	var errs []error
	if rp.Sandbox != nil {
		if err := rp.Sandbox.Stop(ctx); err != nil {
			// The volumes stay in use: unpublishing them under a running workload is what kubelet avoids.
			return fmt.Errorf("co: stop pod %s/%s: %w", rp.Pod.Namespace, rp.Pod.Name, err)
		}
		rp.Sandbox = nil
	}
	for i := len(rp.vols) - 1; i >= 0; i-- {
		if err := c.unmountVolume(ctx, rp, rp.vols[i]); err != nil {
			errs = append(errs, fmt.Errorf("volume %s: %w", rp.vols[i].Volume.Name, err))
		}
	}
	if len(errs) == 0 {
		podDir := c.PodDir(rp.Pod.UID)
		for _, dir := range []string{filepath.Join(podDir, "volumes", "kubernetes.io~csi"), filepath.Join(podDir, "volumes"), podDir} {
			if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("pod directory: %w", err))
				break
			}
		}
		c.mu.Lock()
		delete(c.pods, rp.Pod.UID)
		c.mu.Unlock()
		if c.cfg.API != nil {
			c.cfg.API.deletePod(rp.Pod.Namespace, rp.Pod.Name)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("co: stop pod %s/%s: %w", rp.Pod.Namespace, rp.Pod.Name, err)
	}
	return nil
}

func (c *CO) unmountVolume(ctx context.Context, rp *RunningPod, pv *podVolumeState) error {
	v, d := pv.Volume, pv.Volume.Driver
	key := v.key()
	target := rp.TargetPath(v)
	if pv.published {
		if _, err := d.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.Handle, TargetPath: target}); err != nil {
			return fmt.Errorf("NodeUnpublishVolume: %w", err)
		}
		pv.published = false
	}
	if err := removeDir(target); err != nil {
		return err
	}
	dir := filepath.Dir(target)
	if err := os.Remove(filepath.Join(dir, "vol_data.json")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}

	if pv.staged {
		c.mu.Lock()
		st := c.staged[key]
		last := false
		if st != nil {
			delete(st.users, rp.Pod.UID)
			last = len(st.users) == 0
		}
		c.mu.Unlock()
		if last {
			if _, err := d.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.Handle, StagingTargetPath: st.path}); err != nil {
				c.mu.Lock()
				st.users[rp.Pod.UID] = true
				c.mu.Unlock()
				return fmt.Errorf("NodeUnstageVolume: %w", err)
			}
			c.mu.Lock()
			delete(c.staged, key)
			c.mu.Unlock()
			if err := removeDir(st.path); err != nil {
				return err
			}
			if err := os.Remove(filepath.Join(filepath.Dir(st.path), "vol_data.json")); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
			if err := os.Remove(filepath.Dir(st.path)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
		pv.staged = false
	}

	if pv.attached {
		pv.attached = false
		c.mu.Lock()
		_, stillStaged := c.staged[key]
		_, attached := c.attached[key]
		inUse := stillStaged
		for _, other := range c.pods {
			for _, ov := range other.vols {
				if other != rp && ov.Volume.key() == key && (ov.published || ov.staged) {
					inUse = true
				}
			}
		}
		c.mu.Unlock()
		if attached && !inUse {
			if _, err := d.controller.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: v.Handle, NodeId: d.NodeID}); err != nil {
				pv.attached = true
				return fmt.Errorf("ControllerUnpublishVolume: %w", err)
			}
			c.mu.Lock()
			delete(c.attached, key)
			c.mu.Unlock()
		}
	}
	return nil
}

// removeDir removes a directory kubelet made or the driver left, refusing a mount point.
func removeDir(dir string) error {
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if _, ok, err := mountedAt(dir); err != nil {
		return err
	} else if ok {
		return fmt.Errorf("%s is still a mount point", dir)
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// VolumeStats asks NodeGetVolumeStats for v as published in rp, as kubelet's stats collector does.
func (c *CO) VolumeStats(ctx context.Context, rp *RunningPod, v *Volume) (*csi.NodeGetVolumeStatsResponse, error) {
	caps, err := v.Driver.nodeCaps(ctx)
	if err != nil {
		return nil, err
	}
	if !caps[csi.NodeServiceCapability_RPC_GET_VOLUME_STATS] {
		return nil, status.Errorf(codes.Unimplemented, "driver %s has no GET_VOLUME_STATS", v.Driver.name())
	}
	return v.Driver.node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: v.Handle, VolumePath: rp.TargetPath(v)})
}
