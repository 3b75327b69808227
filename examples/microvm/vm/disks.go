package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"crust.dev/crust/examples/microvm/qmp"
)

// undoDetachTimeout bounds the detach of a disk whose attach failed after the
// guest was given it.
const undoDetachTimeout = 30 * time.Second

// ErrNoFreePort is what AttachBlock and AttachPmem fail with (errors.Is) when every hot-plug port holds a
// device; the error says how many ports the VM has (Config.HotplugPorts).
var ErrNoFreePort = errors.New("vm: no free hot-plug port")

// validID is what a disk id may look like: a QEMU id (a letter, then
// letters, digits, '-', '.', '_') that fits virtio-blk's 20-byte serial.
var validID = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9._-]{0,19}$`)

// AttachBlock hot-plugs the host block device (or regular file, as a raw
// image) at hostPath into the VM as a virtio-blk disk whose serial is id,
// read-only when readOnly, adjusted by opts (WithIOLimits). Attaching the same
// id with the same path, mode and options again does nothing; with others it
// fails. When it fails, nothing of the disk is left in the VM.
func (v *VM) AttachBlock(ctx context.Context, id, hostPath string, readOnly bool, opts ...AttachOption) error {
	var o attachOptions
	for _, opt := range opts {
		opt(&o)
	}
	if !validID.MatchString(id) {
		return fmt.Errorf("vm: disk id %q: want a letter then up to 19 letters, digits, '-', '.', '_'", id)
	}
	fi, err := os.Stat(hostPath)
	if err != nil {
		return fmt.Errorf("vm: %w", err)
	}
	driver := "file"
	switch {
	case fi.Mode()&os.ModeDevice != 0 && fi.Mode()&os.ModeCharDevice == 0:
		driver = "host_device"
	case fi.Mode().IsRegular():
	default:
		return fmt.Errorf("vm: %s is neither a block device nor a regular file", hostPath)
	}

	v.mu.Lock()
	if d, ok := v.disks[id]; ok {
		v.mu.Unlock()
		if d.path == hostPath && d.readOnly == readOnly && d.opts == o {
			return nil
		}
		return fmt.Errorf("vm: disk %s is already attached from %s (read-only %v, I/O limits %+v, host cache %v)", id, d.path,
			d.readOnly, d.opts.limits, d.opts.hostCache)
	}
	port, err := v.reservePort(id)
	v.mu.Unlock()
	if err != nil {
		return err
	}
	release := func() { v.freePort(port) }

	node := nodePrefix + id
	err = v.qmp.Execute(ctx, "blockdev-add", map[string]any{
		"driver":    driver,
		"node-name": node,
		"filename":  hostPath,
		"read-only": readOnly,
		// O_DIRECT unless WithHostCache: the guest has its own page cache.
		"cache":   map[string]any{"direct": !o.hostCache, "no-flush": false},
		"discard": "unmap",
	}, nil)
	if err != nil {
		release()
		return fmt.Errorf("vm: attaching %s: %w", id, err)
	}
	err = v.qmp.Execute(ctx, "device_add", map[string]any{
		"driver": "virtio-blk-pci",
		"id":     diskPrefix + id,
		"bus":    portPrefix + strconv.Itoa(port),
		"drive":  node,
		"serial": id,
	}, nil)
	if err != nil {
		_ = v.qmp.Execute(context.WithoutCancel(ctx), "blockdev-del", map[string]any{"node-name": node}, nil)
		release()
		return fmt.Errorf("vm: attaching %s: %w", id, err)
	}
	v.mu.Lock()
	v.disks[id] = &disk{port: port, path: hostPath, readOnly: readOnly, opts: o}
	v.mu.Unlock()
	if err := v.throttle(ctx, id, o.limits); err != nil {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoDetachTimeout)
		defer cancel()
		return errors.Join(err, v.DetachBlock(dctx, id))
	}
	return nil
}

// DetachBlock hot-unplugs disk id: it asks the guest to release the device,
// waits until QEMU reports it deleted (or ctx ends), then drops the host side.
// The guest should have unmounted it first. Detaching an unknown id does
// nothing.
func (v *VM) DetachBlock(ctx context.Context, id string) error {
	v.mu.Lock()
	d, ok := v.disks[id]
	v.mu.Unlock()
	if !ok {
		return nil
	}
	dev := diskPrefix + id
	events, cancel := v.qmp.Subscribe(16)
	defer cancel()
	err := v.qmp.Execute(ctx, "device_del", map[string]any{"id": dev}, nil)
	var qerr *qmp.Error
	switch {
	case errors.As(err, &qerr) && qerr.Class == "DeviceNotFound":
		// Already gone (an earlier detach that timed out, say).
	case err != nil:
		return fmt.Errorf("vm: detaching %s: %w", id, err)
	default:
		if err := waitDeleted(ctx, events, dev); err != nil {
			return fmt.Errorf("vm: detaching %s: %w", id, err)
		}
	}
	err = v.qmp.Execute(ctx, "blockdev-del", map[string]any{"node-name": nodePrefix + id}, nil)
	if err != nil && !isNodeMissing(err) {
		return fmt.Errorf("vm: detaching %s: %w", id, err)
	}
	v.mu.Lock()
	delete(v.disks, id)
	v.ports[d.port] = ""
	v.mu.Unlock()
	return nil
}

// reservePort takes a free hot-plug port for device id. The caller holds v.mu.
func (v *VM) reservePort(id string) (int, error) {
	for i, holder := range v.ports {
		if holder == "" {
			v.ports[i] = id
			return i, nil
		}
	}
	return -1, fmt.Errorf("%w for %s: all %d hold a device (Config.HotplugPorts)", ErrNoFreePort, id, len(v.ports))
}

// freePort gives back a port reservePort took.
func (v *VM) freePort(port int) {
	v.mu.Lock()
	v.ports[port] = ""
	v.mu.Unlock()
}

// isNodeMissing reports whether err is QEMU's answer to blockdev-del of an
// unknown node: a GenericError "Failed to find node with node-name='...'".
func isNodeMissing(err error) bool {
	var e *qmp.Error
	return errors.As(err, &e) && e.Class == "GenericError" && strings.Contains(e.Desc, "find node")
}

func waitDeleted(ctx context.Context, events <-chan qmp.Event, dev string) error {
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				return qmp.ErrClosed
			}
			if ev.Name != "DEVICE_DELETED" {
				continue
			}
			var data struct {
				Device string `json:"device"`
			}
			if json.Unmarshal(ev.Data, &data) == nil && data.Device == dev {
				return nil
			}
		case <-ctx.Done():
			return fmt.Errorf("waiting for the guest to release the device: %w", ctx.Err())
		}
	}
}

// ResizeBlock tells QEMU that disk id now has size bytes, and the guest sees
// the new capacity. The host device must already have that size (a host
// device cannot be grown by QEMU); growing the filesystem is the agent's
// Grow.
func (v *VM) ResizeBlock(ctx context.Context, id string, size int64) error {
	v.mu.Lock()
	_, ok := v.disks[id]
	v.mu.Unlock()
	if !ok {
		return fmt.Errorf("vm: no disk %s attached", id)
	}
	err := v.qmp.Execute(ctx, "block_resize", map[string]any{"node-name": nodePrefix + id, "size": size}, nil)
	if err != nil {
		return fmt.Errorf("vm: resizing %s: %w", id, err)
	}
	return nil
}
