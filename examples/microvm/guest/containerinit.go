//go:build linux

package guest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/examples/microvm/agentproto"
	"crust.dev/crust/examples/microvm/agentproto/agentv1"
)

// ContainerInitArg is the argument that, as the agent binary's only one, makes it the container init: it reads an
// initSpec from fd 3, enters the container's root as the spec's user and execs the process. Failing, it
// writes an initFailure to fd 3 and exits 127; the exec closes fd 3, which tells the agent it succeeded.
const ContainerInitArg = "container-init"

// defaultPath is searched when the process's env sets no PATH.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// initSpec is what the agent hands the container init.
type initSpec struct {
	Root    string           `json:"root"`
	Process *agentv1.Process `json:"process"`
}

// initFailure is why the container init did not exec; NotFound says the executable is missing.
type initFailure struct {
	NotFound bool   `json:"not_found"`
	Message  string `json:"message"`
}

// encodeSpec is the spec handed to the container init.
func encodeSpec(root string, p *agentv1.Process) ([]byte, error) {
	return json.Marshal(initSpec{Root: root, Process: p})
}

// initError is the error of a container init that answered answer and ended with status; ioErr is how
// talking to it failed, if it did.
func initError(answer []byte, status int, ioErr error) error {
	var f initFailure
	if err := json.Unmarshal(answer, &f); err != nil || f.Message == "" {
		return fmt.Errorf("the container init ended (status %d) without running the process: %v", status, ioErr)
	}
	if f.NotFound {
		return agentproto.Errorf(errdefs.ErrNotFound, "%s", f.Message)
	}
	return agentproto.Errorf(errdefs.ErrFailedPrecondition, "process: %s", f.Message)
}

// errExecNotFound marks a missing executable.
var errExecNotFound = errors.New("executable file not found")

// RunContainerInit runs the container init when the binary was started as one, and then does not return
// (the process becomes the container's); otherwise it returns at once.
func RunContainerInit() {
	if len(os.Args) != 2 || os.Args[1] != ContainerInitArg || os.Getpid() == 1 {
		return
	}
	// Credentials, capabilities and no_new_privs are set on this thread, which then execs.
	runtime.LockOSThread()
	if _, err := unix.FcntlInt(3, unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
		os.Exit(126)
	}
	f := os.NewFile(3, "init")
	err := enterContainer(f)
	b, _ := json.Marshal(initFailure{NotFound: errors.Is(err, errExecNotFound), Message: err.Error()})
	_, _ = f.Write(b)
	os.Exit(127)
}

// enterContainer reads the spec and execs the process; it returns only an error.
func enterContainer(r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return fmt.Errorf("reading the spec: %w", err)
	}
	var spec initSpec
	if err := json.Unmarshal(b, &spec); err != nil || spec.Process == nil {
		return fmt.Errorf("the spec: %v", err)
	}
	p := spec.Process
	if err := unix.Chroot(spec.Root); err != nil {
		return fmt.Errorf("chroot %s: %w", spec.Root, err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	for _, rl := range p.GetRlimits() {
		res := rlimits[rl.GetType()]
		if err := syscall.Setrlimit(res, &syscall.Rlimit{Cur: rl.GetSoft(), Max: rl.GetHard()}); err != nil {
			return fmt.Errorf("rlimits: %s: %w", rl.GetType(), err)
		}
	}
	cwd := p.GetCwd()
	if cwd == "" {
		cwd = "/"
	}
	_ = os.MkdirAll(cwd, 0o755) // as OCI runtimes do; a read-only root fails it, and chdir says so
	if err := setCredentials(p); err != nil {
		return err
	}
	if err := unix.Chdir(cwd); err != nil {
		return fmt.Errorf("cwd %s: %w", cwd, err)
	}
	if p.GetNoNewPrivileges() {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("no_new_privileges: %w", err)
		}
	}
	path, err := lookPath(p.GetArgs()[0], p.GetEnv())
	if err != nil {
		return err
	}
	err = syscall.Exec(path, p.GetArgs(), p.GetEnv())
	return fmt.Errorf("exec %s: %w", path, err)
}

// setCredentials drops the bounding set to p's, becomes p's user keeping the capabilities, then sets the
// effective, permitted, inheritable and ambient sets to p's.
func setCredentials(p *agentv1.Process) error {
	last := lastCap()
	bounding := capSet(p.GetBounding())
	for c := 0; c <= last; c++ {
		if bounding&(1<<c) == 0 {
			if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
				return fmt.Errorf("bounding: dropping %s: %w", capName(c), err)
			}
		}
	}
	if err := unix.Prctl(unix.PR_SET_KEEPCAPS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("keeping capabilities: %w", err)
	}
	groups := make([]int, 0, len(p.GetAdditionalGids()))
	for _, g := range p.GetAdditionalGids() {
		groups = append(groups, int(g))
	}
	if err := syscall.Setgroups(groups); err != nil {
		return fmt.Errorf("additional_gids: %w", err)
	}
	if err := syscall.Setgid(int(p.GetGid())); err != nil {
		return fmt.Errorf("gid: %w", err)
	}
	if err := syscall.Setuid(int(p.GetUid())); err != nil {
		return fmt.Errorf("uid: %w", err)
	}
	var data [2]unix.CapUserData
	for i, set := range []uint64{capSet(p.GetEffective()), capSet(p.GetPermitted()), capSet(p.GetInheritable())} {
		for w := range data {
			v := uint32(set >> (32 * w))
			switch i {
			case 0:
				data[w].Effective = v
			case 1:
				data[w].Permitted = v
			case 2:
				data[w].Inheritable = v
			}
		}
	}
	if err := unix.Capset(&unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}, &data[0]); err != nil {
		return fmt.Errorf("capabilities: %w", err)
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("ambient: %w", err)
	}
	ambient := capSet(p.GetAmbient())
	for c := 0; c <= last; c++ {
		if ambient&(1<<c) != 0 {
			if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_RAISE, uintptr(c), 0, 0); err != nil {
				return fmt.Errorf("ambient: raising %s: %w", capName(c), err)
			}
		}
	}
	return nil
}

// lastCap is the kernel's highest capability number.
func lastCap() int {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n < 64 {
			return n
		}
	}
	return len(capNames) - 1
}

// lookPath finds name in the PATH of env (inside the root, where the process already is) when it holds
// no '/'.
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := defaultPath
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && unix.Access(p, unix.X_OK) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("args[0] %q: %w in PATH %s", name, errExecNotFound, path)
}
