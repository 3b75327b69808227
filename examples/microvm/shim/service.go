package shim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	cgroupstats "github.com/containerd/cgroups/stats/v1"
	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/containerd/api/types/task"
	cerrdefs "github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/events"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/pkg/shutdown"
	"github.com/containerd/containerd/plugin"
	"github.com/containerd/containerd/protobuf"
	"github.com/containerd/containerd/runtime"
	"github.com/containerd/ttrpc"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/examples/microvm/agentproto"
	"crust.dev/crust/examples/microvm/agentproto/agentv1"
)

// registerTaskPlugin registers the task service with the shim library, which serves it on the shim's
// socket with the publisher and shutdown it made.
func registerTaskPlugin() {
	plugin.Register(&plugin.Registration{
		Type:     plugin.TTRPCPlugin,
		ID:       "task",
		Requires: []plugin.Type{plugin.EventPlugin, plugin.InternalPlugin},
		InitFn: func(ic *plugin.InitContext) (any, error) {
			pub, err := ic.GetByID(plugin.EventPlugin, "publisher")
			if err != nil {
				return nil, err
			}
			sd, err := ic.GetByID(plugin.InternalPlugin, "shutdown")
			if err != nil {
				return nil, err
			}
			set, err := SettingsFromEnv()
			if err != nil {
				return nil, err
			}
			// The library has pointed logrus at containerd's log FIFO: crust's slog lines go there too.
			log := slog.New(slog.NewTextHandler(logrus.StandardLogger().Out, nil)).With("shim_pid", os.Getpid())
			ns, _ := namespaces.Namespace(ic.Context)
			s := &service{set: set, log: log, namespace: ns, publisher: pub.(events.Publisher), shutdown: sd.(shutdown.Service),
				containers: map[string]*container{}}
			s.shutdown.RegisterCallback(func(context.Context) error { s.onShutdown(); return nil })
			return s, nil
		},
	})
}

// service is the task service of one sandbox's shim.
type service struct {
	set       Settings
	namespace string // containerd's, for the events
	log       *slog.Logger
	publisher events.Publisher
	shutdown  shutdown.Service

	mu         sync.Mutex
	sandbox    *sandbox // nil until the sandbox container's Create, and after its Delete
	sandboxID  string
	containers map[string]*container
}

// container is one container of the sandbox.
type container struct {
	id, bundle    string
	mountedRootfs bool
	init          *process
	execs         map[string]*process
}

var _ taskAPI.TaskService = (*service)(nil)

// RegisterTTRPC serves the task service on the shim's server.
func (s *service) RegisterTTRPC(server *ttrpc.Server) error {
	taskAPI.RegisterTaskService(server, s)
	return nil
}

// UnaryInterceptor is where every error leaves the task service: crust's errdefs kinds become
// containerd's, which the ttrpc status carries.
func (s *service) UnaryInterceptor() ttrpc.UnaryServerInterceptor {
	return func(ctx context.Context, unmarshal ttrpc.Unmarshaler, info *ttrpc.UnaryServerInfo, method ttrpc.Method) (any, error) {
		resp, err := method(ctx, unmarshal)
		if err != nil {
			s.log.Debug("task call failed", "method", info.FullMethod, "err", err)
			return resp, cerrdefs.ToGRPC(containerdKind(err))
		}
		return resp, nil
	}
}

// containerdKind is err with containerd's errdefs kind for crust's kind (an error of no kind stays as it
// is: unknown).
func containerdKind(err error) error {
	for _, k := range []struct{ crust, containerd error }{
		{errdefs.ErrInvalidArgument, cerrdefs.ErrInvalidArgument},
		{errdefs.ErrNotFound, cerrdefs.ErrNotFound},
		{errdefs.ErrAlreadyExists, cerrdefs.ErrAlreadyExists},
		{errdefs.ErrFailedPrecondition, cerrdefs.ErrFailedPrecondition},
		{errdefs.ErrUnavailable, cerrdefs.ErrUnavailable},
		{errdefs.ErrUnimplemented, cerrdefs.ErrNotImplemented},
	} {
		if errors.Is(err, k.crust) {
			return fmt.Errorf("%w: %s", k.containerd, err.Error())
		}
	}
	return err
}

func (s *service) publish(topic string, ev events.Event) {
	// Events outlive the call that caused them.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.publisher.Publish(namespaces.WithNamespace(ctx, s.namespace), topic, ev); err != nil {
		s.log.Warn("publishing an event failed", "topic", topic, "err", err)
	}
}

// qemuPid is the pid containerd is given for every task: QEMU's.
func (s *service) qemuPid() uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sandbox == nil || s.sandbox.vm == nil {
		return 0
	}
	return uint32(s.sandbox.vm.Pid())
}

// get answers container id's process execID ("" for its first).
func (s *service) get(id, execID string) (*container, *process, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.containers[id]
	if c == nil {
		return nil, nil, errdefs.Errorf(errdefs.ErrNotFound, "container %s", id)
	}
	if execID == "" {
		return c, c.init, nil
	}
	p := c.execs[execID]
	if p == nil {
		return nil, nil, errdefs.Errorf(errdefs.ErrNotFound, "exec %s of container %s", execID, id)
	}
	return c, p, nil
}

func (s *service) Create(ctx context.Context, r *taskAPI.CreateTaskRequest) (*taskAPI.CreateTaskResponse, error) {
	if r.Checkpoint != "" || r.ParentCheckpoint != "" {
		return nil, errdefs.Errorf(errdefs.ErrUnimplemented, "checkpoints")
	}
	spec, err := readSpec(r.Bundle)
	if err != nil {
		return nil, err
	}
	gp, err := processOf(spec.Process)
	if err != nil {
		return nil, err
	}
	sbID, isSandbox := sandboxOf(r.ID, spec)
	log := s.log.With("container", r.ID, "sandbox", sbID)
	s.mu.Lock()
	defer s.mu.Unlock() // Creates are few: one at a time keeps the sandbox's boot simple
	if s.containers[r.ID] != nil {
		return nil, errdefs.Errorf(errdefs.ErrAlreadyExists, "container %s", r.ID)
	}
	if isSandbox {
		if s.sandbox != nil {
			return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "this shim runs sandbox %s already", s.sandboxID)
		}
		sb, err := bootSandbox(ctx, s.set, sbID, spec, log)
		if err != nil {
			return nil, fmt.Errorf("booting the sandbox's VM: %w", err)
		}
		s.sandbox, s.sandboxID = sb, sbID
	} else if s.sandbox == nil || s.sandboxID != sbID {
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s does not run in this shim", sbID)
	}
	sb := s.sandbox
	req, err := sb.prepareContainer(ctx, r.ID, r.Bundle, r.Rootfs, spec)
	if err == nil {
		if _, err = sb.vm.Agent().CreateContainer(ctx, req); err != nil {
			err = errors.Join(fmt.Errorf("creating the container in the guest: %w", err), sb.unprepareContainer(context.WithoutCancel(ctx), r.ID, r.Bundle, len(r.Rootfs) > 0))
		}
	}
	if err != nil {
		if isSandbox {
			err = errors.Join(err, sb.teardown(context.WithoutCancel(ctx)))
			s.sandbox = nil
		}
		return nil, err
	}
	io := stdio{stdin: r.Stdin, stdout: r.Stdout, stderr: r.Stderr, terminal: r.Terminal}
	s.containers[r.ID] = &container{id: r.ID, bundle: r.Bundle, mountedRootfs: len(r.Rootfs) > 0,
		init: newProcess(r.ID, "", io, gp), execs: map[string]*process{}}
	pid := uint32(sb.vm.Pid())
	log.Info("container created")
	s.publish(runtime.TaskCreateEventTopic, &eventstypes.TaskCreate{ContainerID: r.ID, Bundle: r.Bundle, Rootfs: r.Rootfs,
		IO: &eventstypes.TaskIO{Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr, Terminal: r.Terminal}, Pid: pid})
	return &taskAPI.CreateTaskResponse{Pid: pid}, nil
}

func (s *service) Start(ctx context.Context, r *taskAPI.StartRequest) (*taskAPI.StartResponse, error) {
	_, p, err := s.get(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	pid := s.qemuPid()
	agent, err := s.agent()
	if err != nil {
		return nil, err
	}
	if err := p.start(ctx, agent, s.log, s.exited); err != nil {
		return nil, err
	}
	if r.ExecID == "" {
		s.publish(runtime.TaskStartEventTopic, &eventstypes.TaskStart{ContainerID: r.ID, Pid: pid})
	} else {
		s.publish(runtime.TaskExecStartedEventTopic, &eventstypes.TaskExecStarted{ContainerID: r.ID, ExecID: r.ExecID, Pid: pid})
	}
	return &taskAPI.StartResponse{Pid: pid}, nil
}

// exited publishes p's exit.
func (s *service) exited(p *process) {
	status, at, _ := p.exitStatus()
	s.publish(runtime.TaskExitEventTopic, &eventstypes.TaskExit{ContainerID: p.container, ID: p.idOr(), Pid: s.qemuPid(),
		ExitStatus: status, ExitedAt: timestamppb.New(at)})
}

// idOr is the process's id in containerd's events: its exec id, or the container's for the first.
func (p *process) idOr() string {
	if p.exec == "" {
		return p.container
	}
	return p.exec
}

func (s *service) State(_ context.Context, r *taskAPI.StateRequest) (*taskAPI.StateResponse, error) {
	c, p, err := s.get(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	st := &taskAPI.StateResponse{ID: p.idOr(), Bundle: c.bundle, Pid: s.qemuPid(), Stdin: p.io.stdin, Stdout: p.io.stdout,
		Stderr: p.io.stderr, Terminal: p.io.terminal, ExecID: r.ExecID, Status: task.Status_CREATED}
	p.mu.Lock()
	if p.started {
		st.Status = task.Status_RUNNING
	}
	p.mu.Unlock()
	if status, at, ok := p.exitStatus(); ok {
		st.Status, st.ExitStatus, st.ExitedAt = task.Status_STOPPED, status, timestamppb.New(at)
	}
	return st, nil
}

func (s *service) Wait(ctx context.Context, r *taskAPI.WaitRequest) (*taskAPI.WaitResponse, error) {
	_, p, err := s.get(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	select {
	case <-p.exited:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	status, at, _ := p.exitStatus()
	return &taskAPI.WaitResponse{ExitStatus: status, ExitedAt: timestamppb.New(at)}, nil
}

func (s *service) Kill(ctx context.Context, r *taskAPI.KillRequest) (*emptypb.Empty, error) {
	_, p, err := s.get(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	started := p.started
	p.mu.Unlock()
	if !started { // nothing runs in the guest yet: the process ends before it began
		p.setExited(128+r.Signal, time.Now())
		s.exited(p)
		return &emptypb.Empty{}, nil
	}
	agent, err := s.agent()
	if err != nil {
		return nil, err
	}
	_, err = agent.SignalProcess(ctx, &agentv1.SignalProcessRequest{ContainerId: r.ID, ExecId: r.ExecID,
		Signal: int32(r.Signal), All: r.All})
	return &emptypb.Empty{}, err
}

func (s *service) Exec(_ context.Context, r *taskAPI.ExecProcessRequest) (*emptypb.Empty, error) {
	c, _, err := s.get(r.ID, "")
	if err != nil {
		return nil, err
	}
	var ps specs.Process
	if r.Spec == nil || json.Unmarshal(r.Spec.GetValue(), &ps) != nil {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "exec %s: the process spec is missing or not an OCI process", r.ExecID)
	}
	gp, err := processOf(&ps)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if c.execs[r.ExecID] != nil {
		s.mu.Unlock()
		return nil, errdefs.Errorf(errdefs.ErrAlreadyExists, "exec %s of container %s", r.ExecID, r.ID)
	}
	c.execs[r.ExecID] = newProcess(r.ID, r.ExecID, stdio{stdin: r.Stdin, stdout: r.Stdout, stderr: r.Stderr, terminal: r.Terminal}, gp)
	s.mu.Unlock()
	s.publish(runtime.TaskExecAddedEventTopic, &eventstypes.TaskExecAdded{ContainerID: r.ID, ExecID: r.ExecID})
	return &emptypb.Empty{}, nil
}

func (s *service) ResizePty(ctx context.Context, r *taskAPI.ResizePtyRequest) (*emptypb.Empty, error) {
	if _, _, err := s.get(r.ID, r.ExecID); err != nil {
		return nil, err
	}
	agent, err := s.agent()
	if err != nil {
		return nil, err
	}
	_, err = agent.ResizeTerminal(ctx, &agentv1.ResizeTerminalRequest{ContainerId: r.ID, ExecId: r.ExecID,
		Width: r.Width, Height: r.Height})
	return &emptypb.Empty{}, err
}

func (s *service) CloseIO(_ context.Context, r *taskAPI.CloseIORequest) (*emptypb.Empty, error) {
	_, p, err := s.get(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if r.Stdin {
		p.closeStdin()
	}
	return &emptypb.Empty{}, nil
}

func (s *service) Delete(ctx context.Context, r *taskAPI.DeleteRequest) (*taskAPI.DeleteResponse, error) {
	c, p, err := s.get(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	status, at, exited := p.exitStatus()
	p.mu.Lock()
	started := p.started
	p.mu.Unlock()
	if started && !exited {
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "process %s of container %s is running", p.idOr(), r.ID)
	}
	pid := s.qemuPid()
	resp := &taskAPI.DeleteResponse{Pid: pid, ExitStatus: status, ExitedAt: timestamppb.New(at)}
	if r.ExecID != "" {
		s.mu.Lock()
		delete(c.execs, r.ExecID)
		s.mu.Unlock()
		return resp, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sb := s.sandbox
	if sb == nil {
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "the sandbox does not run")
	}
	if _, err := sb.vm.Agent().RemoveContainer(ctx, &agentv1.RemoveContainerRequest{ContainerId: r.ID}); err != nil {
		return nil, fmt.Errorf("removing the container in the guest: %w", err)
	}
	if err := sb.unprepareContainer(ctx, r.ID, c.bundle, c.mountedRootfs); err != nil {
		return nil, err
	}
	delete(s.containers, r.ID)
	s.log.Info("container deleted", "container", r.ID)
	if r.ID == s.sandboxID {
		if err := s.teardownLocked(ctx); err != nil {
			return nil, err
		}
	}
	s.publish(runtime.TaskDeleteEventTopic, &eventstypes.TaskDelete{ContainerID: r.ID, Pid: pid, ExitStatus: status, ExitedAt: resp.ExitedAt})
	return resp, nil
}

// shutdownTimeout bounds the sandbox's teardown when the shim is going: past it the shim exits anyway,
// QEMU and virtiofsd die with it, and crustd releases its claims after its handler grace.
const shutdownTimeout = 2 * time.Minute

// onShutdown is what the shim does before its process exits, at Shutdown and at SIGTERM or SIGINT (the
// library runs it then and exits only once it returned): the sandbox torn down, within shutdownTimeout,
// then the event publisher closed, which the library waits for before it exits.
func (s *service) onShutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		s.mu.Lock() // a Create booting the VM holds it until the boot is over
		defer s.mu.Unlock()
		done <- s.teardownLocked(ctx)
	}()
	select {
	case err := <-done:
		if err != nil {
			s.log.Error("the sandbox's teardown failed; the shim exits", "err", err)
		}
	case <-ctx.Done():
		s.log.Error("the sandbox's teardown did not end in time; the shim exits, and QEMU with it", "timeout", shutdownTimeout)
	}
	if c, ok := s.publisher.(io.Closer); ok {
		_ = c.Close()
	}
}

// teardownLocked removes every container left in the guest and their host mounts, then the sandbox
// (volumes, VM, state). The caller holds s.mu.
func (s *service) teardownLocked(ctx context.Context) error {
	sb := s.sandbox
	if sb == nil {
		return nil
	}
	var errs []error
	for id, c := range s.containers {
		_, _ = sb.vm.Agent().RemoveContainer(ctx, &agentv1.RemoveContainerRequest{ContainerId: id})
		errs = append(errs, sb.unprepareContainer(ctx, id, c.bundle, c.mountedRootfs))
		delete(s.containers, id)
	}
	start := time.Now()
	errs = append(errs, sb.teardown(context.WithoutCancel(ctx)))
	s.sandbox = nil
	err := errors.Join(errs...)
	s.log.Info("sandbox torn down", "sandbox", sb.id, "took", time.Since(start).Round(time.Millisecond), "err", err)
	return err
}

func (s *service) Pids(_ context.Context, r *taskAPI.PidsRequest) (*taskAPI.PidsResponse, error) {
	if _, _, err := s.get(r.ID, ""); err != nil {
		return nil, err
	}
	return &taskAPI.PidsResponse{Processes: []*task.ProcessInfo{{Pid: s.qemuPid()}}}, nil
}

func (s *service) Connect(_ context.Context, _ *taskAPI.ConnectRequest) (*taskAPI.ConnectResponse, error) {
	return &taskAPI.ConnectResponse{ShimPid: uint32(os.Getpid()), TaskPid: s.qemuPid()}, nil
}

// Shutdown ends the shim once it holds no container: the sandbox is torn down first (onShutdown).
func (s *service) Shutdown(_ context.Context, _ *taskAPI.ShutdownRequest) (*emptypb.Empty, error) {
	s.mu.Lock()
	n := len(s.containers)
	s.mu.Unlock()
	if n > 0 {
		return &emptypb.Empty{}, nil
	}
	s.shutdown.Shutdown() // its callback tears the sandbox down
	return &emptypb.Empty{}, nil
}

// Stats answers the container's figures as the guest measures its processes (ContainerStats), in
// cgroups v1's Metrics, which containerd's CRI and ctr decode: CPU usage (total, user, kernel), memory
// usage (the processes' resident memory, also as rss) and the number of processes.
func (s *service) Stats(ctx context.Context, r *taskAPI.StatsRequest) (*taskAPI.StatsResponse, error) {
	if _, _, err := s.get(r.ID, ""); err != nil {
		return nil, err
	}
	agent, err := s.agent()
	if err != nil {
		return nil, err
	}
	st, err := agent.ContainerStats(ctx, &agentv1.ContainerStatsRequest{ContainerId: r.ID})
	if err != nil {
		return nil, fmt.Errorf("measuring container %s in the guest: %w", r.ID, err)
	}
	data, err := typeurl.MarshalAny(cgroupMetrics(st))
	if err != nil {
		return nil, err
	}
	return &taskAPI.StatsResponse{Stats: protobuf.FromAny(data)}, nil
}

// cgroupMetrics is the guest's measure of a container as cgroups v1's Metrics.
func cgroupMetrics(st *agentv1.ContainerStatsResponse) *cgroupstats.Metrics {
	return &cgroupstats.Metrics{
		Pids: &cgroupstats.PidsStat{Current: uint64(st.GetProcesses())},
		CPU: &cgroupstats.CPUStat{Usage: &cgroupstats.CPUUsage{Total: st.GetCpuUserNanos() + st.GetCpuSystemNanos(),
			User: st.GetCpuUserNanos(), Kernel: st.GetCpuSystemNanos()}},
		Memory: &cgroupstats.MemoryStat{RSS: st.GetMemoryRssBytes(), TotalRSS: st.GetMemoryRssBytes(),
			Usage: &cgroupstats.MemoryEntry{Usage: st.GetMemoryRssBytes()}},
	}
}

func (s *service) Pause(_ context.Context, _ *taskAPI.PauseRequest) (*emptypb.Empty, error) {
	return nil, errdefs.Errorf(errdefs.ErrUnimplemented, "pause")
}

func (s *service) Resume(_ context.Context, _ *taskAPI.ResumeRequest) (*emptypb.Empty, error) {
	return nil, errdefs.Errorf(errdefs.ErrUnimplemented, "resume")
}

func (s *service) Checkpoint(_ context.Context, _ *taskAPI.CheckpointTaskRequest) (*emptypb.Empty, error) {
	return nil, errdefs.Errorf(errdefs.ErrUnimplemented, "checkpoint")
}

func (s *service) Update(_ context.Context, _ *taskAPI.UpdateTaskRequest) (*emptypb.Empty, error) {
	return nil, errdefs.Errorf(errdefs.ErrUnimplemented, "update of a crust-microvm container's resources")
}

// agent is the guest agent's client, while the sandbox runs.
func (s *service) agent() (*agentproto.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sandbox == nil {
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "the sandbox does not run")
	}
	return s.sandbox.vm.Agent(), nil
}
