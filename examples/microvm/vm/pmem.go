package vm

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// PmemAlign is the alignment a persistent-memory backing's size must have: QEMU maps it into the guest's
// physical address space in 2 MiB steps, and the guest's pmem driver needs whole sections.
const PmemAlign = 2 << 20

// DefaultPmemMB is Config.PmemMB's default: 256 GiB of guest physical address space for persistent memory
// (only address space: it costs nothing until a device is attached).
const DefaultPmemMB = 256 << 10

// Names of the QEMU objects of a persistent-memory volume.
const (
	memPrefix  = "crust-mem-"
	pmemPrefix = "crust-pmem-"
)

// Pmem is a persistent-memory device attached to the VM, as AttachPmem reports it.
type Pmem struct {
	// Address is the guest physical address QEMU placed the device at: the guest finds the region
	// (and its /dev/pmemN) by it.
	Address uint64
	// Size is the backing's size in bytes.
	Size int64
	// Persistent says the backing is persistent memory on the host too (a file on a DAX file system),
	// so QEMU maps it with pmem=on; otherwise a guest flush is made durable by an fsync of the backing.
	Persistent bool
}

// pmem is a persistent-memory device in the VM.
type pmem struct {
	Pmem
	port     int
	path     string
	readOnly bool
}

// AttachPmem hot-plugs the host file or block device at hostPath into the VM as a virtio-pmem device
// whose memory is the backing itself (a shared memory-backend-file: guest stores reach the backing,
// and a guest flush or sync is an fsync of it on the host), read-only when readOnly. The backing's size
// must be a positive multiple of PmemAlign. Attaching the same id with the same path and mode again
// returns the device as attached; with another path or mode it fails.
//
// Unlike a virtio-blk disk, a virtio-pmem device cannot be unplugged again (QEMU refuses to unplug
// virtio memory devices): it stays in the VM, mapping its backing, until the VM stops. The caller must
// keep the backing reserved for the VM until then.
//
// virtio-pmem rather than an emulated NVDIMM (both measured with QEMU 7.2 and Debian's 6.1 cloud kernel):
// an NVDIMM takes a memory slot and comes up as a raw namespace that refuses DAX until converted to fsdax
// in the guest, which writes an info block onto the volume and moves its data 2 MiB in (the host no longer
// finds its filesystem at offset 0), and QEMU does not fsync an NVDIMM's backing on a guest flush.
// virtio-pmem comes up as fsdax with the data at offset 0, and a guest flush is an fsync of the backing.
func (v *VM) AttachPmem(ctx context.Context, id, hostPath string, readOnly bool) (Pmem, error) {
	if !validID.MatchString(id) {
		return Pmem{}, fmt.Errorf("vm: pmem id %q: want a letter then up to 19 letters, digits, '-', '.', '_'", id)
	}
	size, persistent, err := pmemBacking(hostPath)
	if err != nil {
		return Pmem{}, err
	}
	if size > int64(v.cfg.PmemMB)<<20 {
		return Pmem{}, fmt.Errorf("vm: %s is %d bytes, more than the VM's %d MiB of persistent-memory address space (Config.PmemMB)",
			hostPath, size, v.cfg.PmemMB)
	}
	v.mu.Lock()
	if d, ok := v.pmems[id]; ok {
		p := d.Pmem
		v.mu.Unlock()
		if d.path != hostPath || d.readOnly != readOnly {
			return Pmem{}, fmt.Errorf("vm: pmem %s is already attached from %s (read-only %v)", id, d.path, d.readOnly)
		}
		if p.Address == 0 { // an earlier attach could not learn it
			return v.learnAddress(ctx, id, d)
		}
		return p, nil
	}
	port, err := v.reservePort(id)
	v.mu.Unlock()
	if err != nil {
		return Pmem{}, err
	}
	mem := memPrefix + id
	err = v.qmp.Execute(ctx, "object-add", map[string]any{
		"qom-type": "memory-backend-file",
		"id":       mem,
		"mem-path": hostPath,
		"size":     size,
		"share":    true, // stores go to the backing, not to a private copy
		"pmem":     persistent,
		"readonly": readOnly,
	}, nil)
	if err != nil {
		v.freePort(port)
		return Pmem{}, fmt.Errorf("vm: attaching pmem %s: %w", id, err)
	}
	err = v.qmp.Execute(ctx, "device_add", map[string]any{
		"driver": "virtio-pmem-pci",
		"id":     pmemPrefix + id,
		"bus":    portPrefix + strconv.Itoa(port),
		"memdev": mem,
	}, nil)
	if err != nil {
		_ = v.qmp.Execute(context.WithoutCancel(ctx), "object-del", map[string]any{"id": mem}, nil)
		v.freePort(port)
		return Pmem{}, fmt.Errorf("vm: attaching pmem %s: %w", id, err)
	}
	// From here on the device is in the VM for good: it is recorded even if its address cannot be read.
	d := &pmem{Pmem: Pmem{Size: size, Persistent: persistent}, port: port, path: hostPath, readOnly: readOnly}
	v.mu.Lock()
	v.pmems[id] = d
	v.mu.Unlock()
	return v.learnAddress(ctx, id, d)
}

// learnAddress asks QEMU where it placed pmem device id (d) and records it.
func (v *VM) learnAddress(ctx context.Context, id string, d *pmem) (Pmem, error) {
	addr, err := v.pmemAddress(ctx, pmemPrefix+id)
	if err != nil {
		return Pmem{}, fmt.Errorf("vm: pmem %s: %w", id, err)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	d.Address = addr
	return d.Pmem, nil
}

// pmemAddress asks QEMU where it placed the virtio-pmem device dev in guest physical memory.
func (v *VM) pmemAddress(ctx context.Context, dev string) (uint64, error) {
	var devs []struct {
		Type string `json:"type"`
		Data struct {
			ID      string `json:"id"`
			Memaddr uint64 `json:"memaddr"`
		} `json:"data"`
	}
	var raw json.RawMessage
	if err := v.qmp.Execute(ctx, "query-memory-devices", nil, &raw); err != nil {
		return 0, fmt.Errorf("query-memory-devices: %w", err)
	}
	if err := json.Unmarshal(raw, &devs); err != nil {
		return 0, fmt.Errorf("query-memory-devices: %w", err)
	}
	for _, d := range devs {
		if d.Type == "virtio-pmem" && d.Data.ID == dev {
			return d.Data.Memaddr, nil
		}
	}
	return 0, fmt.Errorf("QEMU lists no virtio-pmem device %s", dev)
}

// pmemBacking checks a persistent-memory backing and returns its size and whether it is persistent
// memory on the host as well: a file whose accesses bypass the page cache (STATX_ATTR_DAX: it lives on
// a file system mounted with DAX over persistent memory). A /dev/pmemN block device is not: mapping a
// block device goes through the host's page cache, and its data becomes durable by the fsync a guest
// flush turns into, as for any other file.
func pmemBacking(path string) (size int64, persistent bool, err error) {
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, 0, unix.STATX_TYPE|unix.STATX_SIZE, &st); err != nil {
		return 0, false, fmt.Errorf("vm: %s: %w", path, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		size = int64(st.Size)
		persistent = st.Attributes_mask&unix.STATX_ATTR_DAX != 0 && st.Attributes&unix.STATX_ATTR_DAX != 0
	case unix.S_IFBLK:
		if size, err = BackingSize(path); err != nil {
			return 0, false, err
		}
	default:
		return 0, false, fmt.Errorf("vm: %s is neither a block device nor a regular file", path)
	}
	if size <= 0 || size%PmemAlign != 0 {
		return 0, false, fmt.Errorf("vm: %s is %d bytes: a persistent-memory backing must be a positive multiple of 2 MiB", path, size)
	}
	return size, persistent, nil
}

// BackingSize is the size in bytes of a disk's or persistent-memory device's backing: a block device or
// a regular file.
func BackingSize(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("vm: %w", err)
	}
	defer func() { _ = f.Close() }()
	n, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return 0, fmt.Errorf("vm: size of %s: %w", path, err)
	}
	return n, nil
}

// Pmems returns the persistent-memory devices in the VM, by id.
func (v *VM) Pmems() map[string]Pmem {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make(map[string]Pmem, len(v.pmems))
	for id, d := range v.pmems {
		out[id] = d.Pmem
	}
	return out
}
