// Package lvm runs LVM's commands for crust's reference CSI driver and its test set-up, with a
// configuration that works on a machine without udev and, where the kernel has no device-mapper, without
// activation: LVM then keeps the metadata (allocation, extents, tags) and the driver maps the extents
// itself (see the lvmdriver package).
//
// Every command gets --config with: a global filter that accepts only the configured physical volumes
// (so LVM never scans anything else, in particular not the devices of the logical volumes), no devices
// file, no udev (udev_sync=0, udev_rules=0, LVM creates its /dev nodes itself), no metadata backups or
// archives under /etc/lvm, and activation=0 when activation is off. A Runner given a system directory
// (UseSystemDir) also turns LVM's asynchronous I/O off, which --config cannot do.
package lvm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// ErrNotFound is returned (wrapped) when a volume group or logical volume does not exist.
var ErrNotFound = errors.New("not found")

// ErrNoSpace is returned (wrapped) when the volume group has too few free extents.
var ErrNoSpace = errors.New("insufficient free space")

// ErrInUse is returned (wrapped) when a logical volume is open and cannot be removed.
var ErrInUse = errors.New("in use")

// Runner runs LVM commands on a fixed set of physical volumes.
type Runner struct {
	// Devices are the physical volumes LVM may look at, such as /dev/loop3. Empty means LVM's own filter.
	Devices []string
	// NoActivation makes every command run with global/activation=0: LVM never talks to device-mapper.
	NoActivation bool
	systemDir    string
}

// UseSystemDir makes LVM read its configuration from dir (LVM_SYSTEM_DIR) instead of /etc/lvm, and
// writes there, creating dir, an lvm.conf with what --config cannot change because LVM sets up its I/O
// before it reads --config: asynchronous I/O off (global/use_aio=0). With it on, every command ends by
// tearing down its AIO context, which waits for an RCU grace period in the kernel: about 30 ms of the
// 45-50 ms that an lvs took on the test machines, against 8-11 ms without. The host's /etc/lvm
// (lvm.conf, lvmlocal.conf, profiles) is then not read; Config is the rest of the configuration.
func (r *Runner) UseSystemDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("lvm system directory: %w", err)
	}
	conf := "# Written by crust's LVM runner: --config cannot change this setting.\nglobal {\n\tuse_aio = 0\n}\n"
	if err := os.WriteFile(filepath.Join(dir, "lvm.conf"), []byte(conf), 0o600); err != nil {
		return fmt.Errorf("lvm system directory: %w", err)
	}
	r.systemDir = dir
	return nil
}

// HasDeviceMapper reports whether the running kernel offers device-mapper (so LVM can activate logical
// volumes): /proc/misc lists it once the driver is built in or loaded.
func HasDeviceMapper() bool {
	b, err := os.ReadFile("/proc/misc")
	return err == nil && regexp.MustCompile(`(?m)^\s*\d+ device-mapper$`).Match(b)
}

// Config returns the --config string every command gets.
func (r *Runner) Config() string {
	var b strings.Builder
	b.WriteString("devices { use_devicesfile=0 obtain_device_list_from_udev=0 external_device_info_source=\"none\" scan_lvs=0")
	if len(r.Devices) > 0 {
		b.WriteString(" global_filter=[")
		for _, d := range r.Devices {
			fmt.Fprintf(&b, "\"a|^%s$|\",", regexp.QuoteMeta(d))
		}
		b.WriteString("\"r|.*|\"]")
	}
	b.WriteString(" } activation { udev_sync=0 udev_rules=0 verify_udev_operations=1 monitoring=0 }")
	b.WriteString(" backup { backup=0 archive=0 }")
	if r.NoActivation {
		b.WriteString(" global { activation=0 }")
	}
	return b.String()
}

// Run runs the LVM command cmd (such as "lvcreate") with args and returns its standard output. A failure
// carries the command's standard error.
func (r *Runner) Run(ctx context.Context, cmd string, args ...string) ([]byte, error) {
	full := append([]string{cmd, "--config", r.Config()}, args...)
	c := exec.CommandContext(ctx, "lvm", full...)
	c.Env = append(os.Environ(), "LVM_SUPPRESS_FD_WARNINGS=1", "DM_DISABLE_UDEV=1")
	if r.systemDir != "" {
		c.Env = append(c.Env, "LVM_SYSTEM_DIR="+r.systemDir)
	}
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	if err := c.Run(); err != nil {
		msg := strings.TrimSpace(filterWarnings(stderr.String()))
		return stdout.Bytes(), &CommandError{Cmd: cmd, Args: args, Stderr: msg, Err: err}
	}
	return stdout.Bytes(), nil
}

// CommandError is a failed LVM command.
type CommandError struct {
	Cmd    string
	Args   []string
	Stderr string
	Err    error
}

func (e *CommandError) Error() string {
	return fmt.Sprintf("lvm %s %s: %v: %s", e.Cmd, strings.Join(e.Args, " "), e.Err, e.Stderr)
}

func (e *CommandError) Unwrap() error { return e.Err }

// Is classifies LVM's messages: "not found" / "Failed to find" as ErrNotFound, "Insufficient free space"
// as ErrNoSpace, "in use" / "open" as ErrInUse.
func (e *CommandError) Is(target error) bool {
	s := strings.ToLower(e.Stderr)
	switch target {
	case ErrNotFound:
		return strings.Contains(s, "not found") || strings.Contains(s, "failed to find")
	case ErrNoSpace:
		return strings.Contains(s, "insufficient free space") || strings.Contains(s, "insufficient suitable")
	case ErrInUse:
		return strings.Contains(s, "in use") || strings.Contains(s, "is open")
	}
	return false
}

// filterWarnings drops the lines LVM prints when activation is off or udev is absent, which say nothing
// about a failure.
func filterWarnings(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "WARNING: Activation disabled") || strings.Contains(t, "not zeroed") {
			continue
		}
		out = append(out, t)
	}
	return strings.Join(out, "; ")
}

// VG is a volume group's size in bytes.
type VG struct {
	Name       string
	ExtentSize int64
	Size       int64
	Free       int64
}

// Segment is one linear piece of a logical volume: Size bytes at Start in the volume, found on PV
// starting at its physical extent PE.
type Segment struct {
	Start int64
	Size  int64
	PV    string
	PE    int64
	Type  string
}

// LV is a logical volume.
type LV struct {
	Name     string
	Size     int64
	Tags     []string
	Segments []Segment
}

// HasTag reports whether the volume carries tag.
func (lv *LV) HasTag(tag string) bool {
	for _, t := range lv.Tags {
		if t == tag {
			return true
		}
	}
	return false
}

type report struct {
	Report []struct {
		VG  []map[string]string `json:"vg"`
		PV  []map[string]string `json:"pv"`
		Seg []map[string]string `json:"seg"`
	} `json:"report"`
}

func (r *Runner) report(ctx context.Context, cmd string, args ...string) (*report, error) {
	args = append([]string{"--reportformat", "json", "--units", "b", "--nosuffix"}, args...)
	out, err := r.Run(ctx, cmd, args...)
	if err != nil {
		return nil, err
	}
	var rep report
	if err := json.Unmarshal(out, &rep); err != nil {
		return nil, fmt.Errorf("lvm %s: parse report: %w", cmd, err)
	}
	return &rep, nil
}

// VG returns the volume group's sizes.
func (r *Runner) VG(ctx context.Context, vg string) (*VG, error) {
	rep, err := r.report(ctx, "vgs", "-o", "vg_name,vg_extent_size,vg_size,vg_free", "--", vg)
	if err != nil {
		return nil, err
	}
	for _, rr := range rep.Report {
		for _, m := range rr.VG {
			if m["vg_name"] == vg {
				return &VG{Name: vg, ExtentSize: atoi(m["vg_extent_size"]), Size: atoi(m["vg_size"]), Free: atoi(m["vg_free"])}, nil
			}
		}
	}
	return nil, fmt.Errorf("volume group %q: %w", vg, ErrNotFound)
}

// PEStarts returns, for each physical volume of vg, the byte offset of its first extent.
func (r *Runner) PEStarts(ctx context.Context, vg string) (map[string]int64, error) {
	rep, err := r.report(ctx, "pvs", "-o", "pv_name,pe_start,vg_name")
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, rr := range rep.Report {
		for _, m := range rr.PV {
			if m["vg_name"] == vg {
				out[m["pv_name"]] = atoi(m["pe_start"])
			}
		}
	}
	return out, nil
}

var devicesRE = regexp.MustCompile(`^(.+)\((\d+)\)$`)

// LVs returns the logical volumes of vg (name "" for every one) with their segments, ordered as LVM
// reports them. A volume that does not exist gives an error wrapping ErrNotFound.
func (r *Runner) LVs(ctx context.Context, vg, name string) ([]*LV, error) {
	target := vg
	if name != "" {
		target = vg + "/" + name
	}
	rep, err := r.report(ctx, "lvs", "--segments", "-o", "lv_name,lv_size,lv_tags,seg_start,seg_size,segtype,devices", "--", target)
	if err != nil {
		return nil, err
	}
	var lvs []*LV
	byName := map[string]*LV{}
	for _, rr := range rep.Report {
		for _, m := range rr.Seg {
			lv := byName[m["lv_name"]]
			if lv == nil {
				lv = &LV{Name: m["lv_name"], Size: atoi(m["lv_size"])}
				if m["lv_tags"] != "" {
					lv.Tags = strings.Split(m["lv_tags"], ",")
				}
				byName[lv.Name] = lv
				lvs = append(lvs, lv)
			}
			seg := Segment{Start: atoi(m["seg_start"]), Size: atoi(m["seg_size"]), Type: m["segtype"]}
			if d := devicesRE.FindStringSubmatch(m["devices"]); d != nil {
				seg.PV, seg.PE = d[1], atoi(d[2])
			}
			lv.Segments = append(lv.Segments, seg)
		}
	}
	if name != "" && len(lvs) == 0 {
		return nil, fmt.Errorf("logical volume %s: %w", target, ErrNotFound)
	}
	return lvs, nil
}

// LV returns one logical volume, or an error wrapping ErrNotFound.
func (r *Runner) LV(ctx context.Context, vg, name string) (*LV, error) {
	lvs, err := r.LVs(ctx, vg, name)
	if err != nil {
		return nil, err
	}
	return lvs[0], nil
}

func atoi(s string) int64 {
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}
