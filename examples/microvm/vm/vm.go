// Package vm runs the crust microVM: a QEMU q35 machine booting a kernel and
// the crust guest initramfs, controlled over QMP, with the crust-guest agent
// reached over a virtio-serial port. It hot-plugs host block devices into the
// VM as virtio-blk disks (whose serial is the caller's id, which the agent's
// mount looks for) and resizes them; the agent, from Agent, mounts and grows
// them inside. It hot-plugs persistent memory (a file or a pmem device) as
// virtio-pmem devices (AttachPmem), which the agent finds by their address and
// mounts with DAX; those cannot be unplugged and stay until the VM stops
// (QEMU 7.2 refuses to unplug virtio memory devices; an emulated NVDIMM,
// which needs converting to fsdax inside the guest, is not used: see
// AttachPmem). It can also share host directories over virtio-9p (Config.Shares)
// and virtio-fs (Config.FSShares, each served by a virtiofsd the VM runs), which
// the guest mounts itself; crust does not use them for volumes, they are there
// to compare the data paths (test/bench).
//
// A VM's files (sockets, console log, QEMU's own log) live in its StateDir.
// Stop leaves no process and no socket behind; the logs stay for debugging.
// QEMU is killed when the process that started it dies, however it dies.
package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"crust.dev/crust/examples/microvm/agentproto"
	"crust.dev/crust/examples/microvm/agentproto/agentv1"
	"crust.dev/crust/examples/microvm/qmp"
)

// Accel selects QEMU's accelerator.
type Accel string

// The accelerators.
const (
	// AccelTCG is software emulation: slower, works everywhere.
	AccelTCG Accel = "tcg"
	// AccelKVM is hardware virtualisation through /dev/kvm.
	AccelKVM Accel = "kvm"
	// AccelAuto tries KVM when /dev/kvm can be opened and falls back to TCG
	// when KVM fails or its guest does not answer within Config.KVMTimeout.
	AccelAuto Accel = "auto"
)

// Config describes a VM.
type Config struct {
	// Kernel and Initramfs are the images to boot (see the initramfs package). Kernel may be a bzImage or
	// an ELF kernel with a PVH entry point, which boots sooner under TCG: it skips the decompressor
	// (hack/guest/fetch-kernel.sh unpacks Debian's kernel so).
	Kernel    string
	Initramfs string
	// MemoryMB is the guest's memory; 0 means 512.
	MemoryMB int
	// CPUs is the number of vCPUs; 0 means 1.
	CPUs int
	// Accel is the accelerator; "" means AccelAuto.
	Accel Accel
	// CPU is QEMU's -cpu model for every attempt; "" means "host" under KVM
	// and QEMU's default under TCG.
	CPU string
	// StateDir holds the VM's sockets and logs; it is created (0700) if
	// missing. Its path must be short enough for unix sockets (about 90 bytes).
	StateDir string
	// QEMU is the emulator binary; "" means qemu-system-x86_64 from PATH.
	QEMU string
	// HotplugPorts is the number of PCIe root ports, which bounds the disks
	// and persistent-memory devices attached at once: one a port, and
	// AttachBlock and AttachPmem fail with ErrNoFreePort beyond it; 0 means 8.
	// The ports sit on the q35 root bus eight to a slot (the functions of a
	// multifunction device), in slots 2 to 30 less one slot for each of
	// Shares and FSShares: at most MaxHotplugPorts (232) with no shares. The
	// guest bounds them lower: each port takes one of its interrupt vectors
	// (about 200 a vCPU), and a guest with one vCPU boots with 192 ports but
	// not with 232. A port costs about 80 KiB of QEMU's memory, and in the
	// guest a PCI bus number, about 70 KiB of memory and boot time (under
	// TCG about 20 ms a port at 32, more a port with more): see
	// docs/performance.md.
	HotplugPorts int
	// PmemMB is the guest physical address space kept for persistent-memory
	// devices (AttachPmem), in MiB: their sizes together may not exceed it.
	// It costs the guest no memory until a device is attached. 0 means
	// DefaultPmemMB.
	PmemMB int
	// KernelArgs are appended to the kernel command line.
	KernelArgs string
	// BootTimeout bounds the wait for the agent to answer; 0 means 60 s.
	BootTimeout time.Duration
	// KVMTimeout bounds the KVM attempt of AccelAuto; 0 means 10 s.
	KVMTimeout time.Duration
	// Shares are host directories exported to the guest over virtio-9p, one
	// virtio-9p-pci device each, present from boot (not hot-plugged). The
	// guest mounts one with
	//	mount -t 9p -o trans=virtio,version=9p2000.L TAG DIR
	// which needs a kernel with 9p (the generic flavour of the guest assets).
	Shares []Share
	// FSShares are host directories exported to the guest over virtio-fs, one
	// virtiofsd and vhost-user-fs-pci device each, present from boot (see
	// FSShare). With any, the guest's memory is a shared memfd.
	FSShares []FSShare
	// VirtioFSD is the virtiofsd binary for FSShares; "" means FindVirtioFSD.
	VirtioFSD string
	// NICs are the guest's network cards (see NIC), each taking a slot of the root bus as a share does.
	NICs []NIC
}

// Share is a host directory exported to the guest over virtio-9p (QEMU's
// -fsdev local with security_model=passthrough: QEMU, which runs as the
// caller, creates files with the guest's owners and modes).
type Share struct {
	// Tag is the name the guest mounts it by: a letter or digit, then up to
	// 30 letters, digits, '.', '_' or '-'; distinct among the shares.
	Tag string
	// Path is the host directory; it must exist.
	Path string
	// ReadOnly exports it read-only.
	ReadOnly bool
}

// validTag is what a share's tag may look like: safe in a QEMU option value
// and within the 31 bytes older QEMUs accept as a mount_tag.
var validTag = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,30}$`)

func (c *Config) setDefaults() error {
	if c.Kernel == "" || c.Initramfs == "" || c.StateDir == "" {
		return errors.New("vm: Kernel, Initramfs and StateDir are required")
	}
	for _, f := range []string{c.Kernel, c.Initramfs} {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("vm: %w", err)
		}
	}
	if c.MemoryMB == 0 {
		c.MemoryMB = 512
	}
	if c.CPUs == 0 {
		c.CPUs = 1
	}
	if c.Accel == "" {
		c.Accel = AccelAuto
	}
	switch c.Accel {
	case AccelTCG, AccelKVM, AccelAuto:
	default:
		return fmt.Errorf("vm: unknown accelerator %q", c.Accel)
	}
	if c.QEMU == "" {
		c.QEMU = "qemu-system-x86_64"
	}
	if c.HotplugPorts == 0 {
		c.HotplugPorts = 8
	}
	if free := portSlots - len(c.Shares) - len(c.FSShares) - len(c.NICs); c.HotplugPorts < 0 || (c.HotplugPorts+portsPerSlot-1)/portsPerSlot > free {
		return fmt.Errorf("vm: %d hot-plug ports: want 1 to %d (%d a slot, %d slots of the root bus, less one a share or NIC)",
			c.HotplugPorts, max(0, free)*portsPerSlot, portsPerSlot, portSlots)
	}
	if err := c.checkNICs(); err != nil {
		return err
	}
	if c.PmemMB == 0 {
		c.PmemMB = DefaultPmemMB
	}
	if c.BootTimeout == 0 {
		c.BootTimeout = 60 * time.Second
	}
	if c.KVMTimeout == 0 {
		c.KVMTimeout = 10 * time.Second
	}
	abs, err := filepath.Abs(c.StateDir)
	if err != nil {
		return fmt.Errorf("vm: %w", err)
	}
	c.StateDir = abs
	if err := c.checkShares(); err != nil {
		return err
	}
	if err := c.checkFSShares(); err != nil {
		return err
	}
	// sun_path holds 108 bytes with its terminating NUL.
	if n := len(filepath.Join(c.StateDir, "agent.sock")); n > 107 {
		return fmt.Errorf("vm: StateDir %s is too long for a unix socket path (%d bytes)", c.StateDir, n)
	}
	return os.MkdirAll(c.StateDir, 0o700)
}

// checkShares validates the shares and makes their paths absolute (in a copy:
// the caller's slice is not changed).
func (c *Config) checkShares() error {
	shares := make([]Share, 0, len(c.Shares))
	tags := map[string]bool{}
	for _, sh := range c.Shares {
		abs, err := checkShare(tags, sh.Tag, sh.Path)
		if err != nil {
			return err
		}
		sh.Path = abs
		shares = append(shares, sh)
	}
	c.Shares = shares
	return nil
}

// checkShare validates a share's tag, distinct from those in tags (to which it
// adds it), and its directory, whose absolute path it returns.
func checkShare(tags map[string]bool, tag, dir string) (string, error) {
	if !validTag.MatchString(tag) {
		return "", fmt.Errorf("vm: share tag %q: want a letter or digit, then up to 30 letters, digits, '.', '_', '-'", tag)
	}
	if tags[tag] {
		return "", fmt.Errorf("vm: share tag %q given twice", tag)
	}
	tags[tag] = true
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("vm: share %s: %w", tag, err)
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return "", fmt.Errorf("vm: share %s: %w", tag, err)
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("vm: share %s: %s is not a directory", tag, abs)
	}
	return abs, nil
}

// BootInfo tells how a VM came up.
type BootInfo struct {
	// Accel is the accelerator the VM runs with.
	Accel Accel
	// Took is the time from starting QEMU to the agent's first answer (of
	// the attempt that succeeded).
	Took time.Duration
	// Fallback says why AccelAuto fell back to TCG; empty when it did not.
	Fallback string
	// Kernel is the guest kernel's release.
	Kernel string
}

// VM is a running microVM. Its methods are safe for concurrent use.
type VM struct {
	cfg   Config
	boot  BootInfo
	cmd   *exec.Cmd
	done  chan struct{} // closed when QEMU has exited
	qmp   *qmp.Client
	agent *agentproto.Client
	// fsDaemons are the virtiofsd processes of Config.FSShares, in order.
	fsDaemons []*fsDaemon

	mu      sync.Mutex
	ports   []string         // hot-plug root port i holds device ports[i] ("" when free)
	disks   map[string]*disk // by id
	pmems   map[string]*pmem // by id; never removed: they cannot be unplugged
	stop    sync.Once
	stopErr error
}

// disk is a host device attached to the VM.
type disk struct {
	port     int
	path     string
	readOnly bool
	opts     attachOptions
}

// Start boots a VM and returns once its agent answers, or with an error
// (after killing QEMU) when it does not within the timeouts or ctx ends.
// QEMU is killed when the OS thread that started it ends, which in Go is
// when the process ends, unless the caller's goroutine is locked to its
// thread (runtime.LockOSThread) and returns: do not call Start from one.
func Start(ctx context.Context, cfg Config) (*VM, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	switch cfg.Accel {
	case AccelTCG, AccelKVM:
		return boot(ctx, cfg, cfg.Accel, cfg.BootTimeout)
	}
	fallback := ""
	if err := kvmUsable(); err != nil {
		fallback = err.Error()
	} else {
		v, err := boot(ctx, cfg, AccelKVM, cfg.KVMTimeout)
		if err == nil {
			return v, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		fallback = err.Error()
	}
	v, err := boot(ctx, cfg, AccelTCG, cfg.BootTimeout)
	if err != nil {
		return nil, err
	}
	v.boot.Fallback = fallback
	return v, nil
}

func kvmUsable() error {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("KVM unusable: %w", err)
	}
	return f.Close()
}

func (c *Config) path(name string) string { return filepath.Join(c.StateDir, name) }

// qemuPath escapes a path for a QEMU option value, where ',' is doubled.
func qemuPath(p string) string { return strings.ReplaceAll(p, ",", ",,") }

// Names of the VM's QEMU objects.
const (
	agentChardev = "crust-agent"
	serialBus    = "crust-vser"
	portPrefix   = "crust-rp"
	nodePrefix   = "crust-node-"
	diskPrefix   = "crust-disk-"
	fsdevPrefix  = "crust-fs"
	sharePrefix  = "crust-9p"
	rngObject    = "crust-rng"
)

// Where the devices sit on the q35 root bus (pcie.0), which has 32 slots of 8 functions: slot 0 is the
// host bridge and slot 31 the ICH9 LPC, SATA and SMBus functions, both built into the machine. The
// virtio-serial controller takes slot 1 (function 0) with the random source (function 1); the hot-plug root ports take slots from firstPortSlot on, eight
// to a slot, each slot's function 0 flagged multifunction; the shares' devices, placed by QEMU, take
// the next free slots. The ports reserve no I/O-port window (io-reserve=0): the disks hot-plugged into
// them are virtio 1.0 devices, which a PCIe port gives no legacy I/O BAR, and the 64 KiB of port I/O
// space runs out after about a dozen bridges that each reserve 4 KiB.
const (
	serialSlot    = 1
	firstPortSlot = 2
	portsPerSlot  = 8
	// portSlots is how many slots the ports and the shares have: 2 to 30.
	portSlots = 31 - firstPortSlot
	// MaxHotplugPorts bounds Config.HotplugPorts: the ports that fit on the root bus with no shares.
	MaxHotplugPorts = portSlots * portsPerSlot
)

// portAddr is the root-bus address of hot-plug port i: slot.function, in hex as QEMU's addr wants it.
func portAddr(i int) string {
	return fmt.Sprintf("0x%x.%d", firstPortSlot+i/portsPerSlot, i%portsPerSlot)
}

func (c *Config) args(accel Accel) []string {
	// no_timer_check: under TCG on a busy host the kernel's check that the IO-APIC timer ticks can fail
	// and panic the boot ("IO-APIC + timer doesn't work"); the guest needs no such check.
	// cryptomgr.notests and initcall_blacklist=crypto_kdf108_init skip the self-tests the kernel runs of
	// its own crypto code at every boot (the second is the KDF's, which the first does not cover): under
	// TCG they held the boot to the agent about 0.4 s longer (medians of 10 and 16 boots taken in turns
	// with and without them, 3.9 s and 4.5 s without). The agent speaks over virtio-serial and a pod's
	// network (NICs) is IPv4 only, so ipv6.disable=1 skips IPv6's set-up, 0.39 s of a boot traced under
	// TCG, and the kprobe tracer's set-up (init_kprobe_trace, 0.07 s) is skipped as well.
	cmdline := "console=ttyS0 panic=-1 quiet no_timer_check cryptomgr.notests ipv6.disable=1 " +
		"initcall_blacklist=crypto_kdf108_init,init_kprobe_trace"
	if c.KernelArgs != "" {
		cmdline += " " + c.KernelArgs
	}
	args := []string{
		"-name", "crust",
		"-machine", "q35",
		"-accel", string(accel),
		// maxmem makes room for hot-plugged memory devices (virtio-pmem); slots counts DIMMs, which
		// crust does not plug, but QEMU wants at least one to allow memory hot-plug at all.
		"-m", fmt.Sprintf("%d,slots=1,maxmem=%dM", c.MemoryMB, c.MemoryMB+c.PmemMB),
		"-smp", strconv.Itoa(c.CPUs),
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-kernel", c.Kernel,
		"-initrd", c.Initramfs,
		"-append", cmdline,
		"-chardev", "file,id=crust-console,path=" + qemuPath(c.path("console.log")),
		"-serial", "chardev:crust-console",
		"-qmp", "unix:" + qemuPath(c.path("qmp.sock")) + ",server=on,wait=off",
		"-chardev", "socket,id=" + agentChardev + ",path=" + qemuPath(c.path("agent.sock")) + ",server=on,wait=off",
		"-device", fmt.Sprintf("virtio-serial-pci,id=%s,bus=pcie.0,addr=0x%x.0,multifunction=on", serialBus, serialSlot),
		"-device", "virtserialport,bus=" + serialBus + ".0,chardev=" + agentChardev + ",name=" + agentproto.PortName,
		// A random source from the host: without one the guest's CRNG is still not ready long after
		// boot under TCG, and every program that asks for random bytes waits (mke2fs took 4 s for its
		// UUIDs on any volume, and nearly nothing else).
		"-object", "rng-random,id=" + rngObject + ",filename=/dev/urandom",
		"-device", fmt.Sprintf("virtio-rng-pci,rng=%s,bus=pcie.0,addr=0x%x.1", rngObject, serialSlot),
	}
	switch {
	case c.CPU != "":
		args = append(args, "-cpu", c.CPU)
	case accel == AccelKVM:
		args = append(args, "-cpu", "host")
	}
	for i := range c.HotplugPorts {
		port := fmt.Sprintf("pcie-root-port,id=%s%d,chassis=%d,bus=pcie.0,addr=%s,io-reserve=0", portPrefix, i, i+1, portAddr(i))
		if i%portsPerSlot == 0 {
			port += ",multifunction=on"
		}
		args = append(args, "-device", port)
	}
	for i, sh := range c.Shares {
		fsdev := fmt.Sprintf("local,id=%s%d,path=%s,security_model=passthrough", fsdevPrefix, i, qemuPath(sh.Path))
		if sh.ReadOnly {
			fsdev += ",readonly=on"
		}
		args = append(args, "-fsdev", fsdev,
			"-device", fmt.Sprintf("virtio-9p-pci,id=%s%d,fsdev=%s%d,mount_tag=%s", sharePrefix, i, fsdevPrefix, i, sh.Tag))
	}
	return append(append(args, c.fsShareArgs()...), c.nicArgs()...)
}

// boot runs one attempt with one accelerator.
func boot(ctx context.Context, cfg Config, accel Accel, timeout time.Duration) (*VM, error) {
	cleanSockets(&cfg)
	logf, err := os.OpenFile(cfg.path("qemu.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("vm: %w", err)
	}
	_, _ = fmt.Fprintf(logf, "--- %s starting with %s\n", time.Now().Format(time.RFC3339), accel)
	// A fresh console log per attempt, so it shows the VM that runs.
	_ = os.Remove(cfg.path("console.log"))

	v := &VM{
		cfg:   cfg,
		boot:  BootInfo{Accel: accel},
		done:  make(chan struct{}),
		ports: make([]string, cfg.HotplugPorts),
		disks: make(map[string]*disk),
		pmems: make(map[string]*pmem),
	}
	// The virtio-fs daemons listen before QEMU starts, which connects to them at once.
	if v.fsDaemons, err = startFSDaemons(&cfg, timeout); err != nil {
		_ = logf.Close()
		return nil, err
	}
	v.cmd = exec.Command(cfg.QEMU, cfg.args(accel)...)
	v.cmd.Stdout, v.cmd.Stderr = logf, logf
	v.cmd.ExtraFiles = cfg.nicFiles()
	v.cmd.SysProcAttr = &syscall.SysProcAttr{
		// QEMU dies with the process that started it, even by SIGKILL, so a
		// crashed handler leaves no VM holding its devices (see Start).
		Pdeathsig: syscall.SIGKILL,
		// Its own process group: a ^C at the handler's terminal goes to the
		// handler, which then stops the VM in order, not to QEMU directly.
		Setpgid: true,
	}
	start := time.Now()
	if err := v.cmd.Start(); err != nil {
		_ = logf.Close()
		stopFSDaemons(v.fsDaemons)
		return nil, fmt.Errorf("vm: starting %s: %w", cfg.QEMU, err)
	}
	go func() {
		_ = v.cmd.Wait()
		_ = logf.Close()
		close(v.done)
	}()

	bctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := v.connect(bctx); err != nil {
		v.kill()
		return nil, fmt.Errorf("vm: %s boot: %w%s", accel, err, v.logTails())
	}
	v.boot.Took = time.Since(start)
	return v, nil
}

// connect dials QMP and the agent's socket and pings the agent until it
// answers.
func (v *VM) connect(ctx context.Context) error {
	var err error
	v.qmp, err = dialRetry(ctx, v.done, func(ctx context.Context) (*qmp.Client, error) {
		return qmp.Dial(ctx, v.cfg.path("qmp.sock"))
	})
	if err != nil {
		return fmt.Errorf("QMP: %w", err)
	}
	// The session is accepted once the agent serves: waiting for that is waiting for the guest to boot.
	v.agent, err = dialRetry(ctx, v.done, func(ctx context.Context) (*agentproto.Client, error) {
		return agentproto.Dial(ctx, v.cfg.path("agent.sock"))
	})
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	h, err := v.agent.Health(ctx, &agentv1.HealthRequest{})
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	v.boot.Kernel = h.GetKernel()
	return nil
}

// dialRetry calls dial until it succeeds, QEMU exits or ctx ends: QEMU
// creates its sockets a moment after it starts.
func dialRetry[T any](ctx context.Context, exited <-chan struct{}, dial func(context.Context) (T, error)) (T, error) {
	for {
		c, err := dial(ctx)
		if err == nil {
			return c, nil
		}
		select {
		case <-exited:
			return c, fmt.Errorf("QEMU exited (%v)", err)
		case <-ctx.Done():
			return c, fmt.Errorf("%w (%v)", ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// logTails returns the ends of QEMU's and the console's logs for an error.
func (v *VM) logTails() string {
	var b strings.Builder
	names := []string{"qemu.log", "console.log"}
	for i := range v.cfg.FSShares {
		names = append(names, fmt.Sprintf(vfsLogName, i))
	}
	for _, name := range names {
		data, err := os.ReadFile(v.cfg.path(name))
		if err != nil || len(strings.TrimSpace(string(data))) == 0 {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		lines = lines[max(0, len(lines)-8):]
		fmt.Fprintf(&b, "\n%s:\n  %s", name, strings.Join(lines, "\n  "))
	}
	return b.String()
}

// kill ends QEMU at once and cleans up; for failed boots and Stop's last resort.
func (v *VM) kill() {
	if v.cmd.Process != nil {
		_ = v.cmd.Process.Kill()
	}
	<-v.done
	stopFSDaemons(v.fsDaemons) // they exit by themselves once QEMU is gone
	v.closeClients()
	cleanSockets(&v.cfg)
}

func (v *VM) closeClients() {
	if v.agent != nil {
		_ = v.agent.Close()
	}
	if v.qmp != nil {
		_ = v.qmp.Close()
	}
}

func cleanSockets(cfg *Config) {
	for _, s := range []string{"qmp.sock", "agent.sock"} {
		_ = os.Remove(cfg.path(s))
	}
	for i := range cfg.FSShares {
		_ = os.Remove(cfg.path(fmt.Sprintf(vfsSocketName, i)))
	}
}

// Boot tells how the VM came up.
func (v *VM) Boot() BootInfo { return v.boot }

// Agent is the client of the guest agent.
func (v *VM) Agent() *agentproto.Client { return v.agent }

// Done is closed when QEMU has exited, whether by Stop or on its own (a
// guest power-off or crash).
func (v *VM) Done() <-chan struct{} { return v.done }

// Exit says how QEMU ended ("signal: killed", "exit status 1"); "" while it runs.
func (v *VM) Exit() string {
	select {
	case <-v.done:
		return v.cmd.ProcessState.String()
	default:
		return ""
	}
}

// ConsoleLog is the path of the guest's serial console log.
func (v *VM) ConsoleLog() string { return v.cfg.path("console.log") }

// Pid is QEMU's process id.
func (v *VM) Pid() int { return v.cmd.Process.Pid }

// Stop shuts the VM down: it asks the agent to unmount and sync the guest's
// volumes, then QEMU to quit, and kills QEMU if it has not exited in time or
// ctx ends first. It removes the sockets. Calling it again returns the first
// call's result.
func (v *VM) Stop(ctx context.Context) error {
	v.stop.Do(func() { v.stopErr = v.shutdown(ctx) })
	return v.stopErr
}

func (v *VM) shutdown(ctx context.Context) error {
	wait := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-v.done:
			return true
		case <-t.C:
		case <-ctx.Done():
		}
		return false
	}
	exited := false
	select {
	case <-v.done:
		exited = true
	default:
	}
	if !exited && ctx.Err() == nil {
		// The agent answers once every volume is unmounted and synced (or cannot answer: then the
		// guest's page cache may be lost, as with a power cut); either way QEMU is told to quit, which
		// flushes its disks.
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, _ = v.agent.Shutdown(sctx, &agentv1.ShutdownRequest{})
		cancel()
	}
	if !exited && ctx.Err() == nil {
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_ = v.qmp.Execute(qctx, "quit", nil, nil)
		cancel()
		exited = wait(5 * time.Second)
	}
	v.kill() // a no-op kill when QEMU is gone; closes clients, removes sockets
	if !exited {
		return fmt.Errorf("vm: QEMU did not stop by itself and was killed")
	}
	return nil
}
