package handler_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"crust.dev/crust/api/handler"
	"crust.dev/crust/api/kata"
)

// A handler that reads files follows the Kata projection: it learns of a volume when its descriptor
// appears, of the sandbox that uses it, and of its removal.
func ExampleWatchKataDir() {
	dir, _ := os.MkdirTemp("", "kata-direct-volumes")
	defer func() { _ = os.RemoveAll(dir) }()
	target := "/var/lib/kubelet/pods/p1/volumes/kubernetes.io~csi/pv1/mount"

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	steps := []func(){
		func() { _ = kata.Add(dir, target, `{"volume-type":"block","device":"/dev/loop3","fstype":"xfs"}`) },
		func() { // sandbox-1 starts to use it: a Kata shim records that with an empty file named after it
			_ = os.WriteFile(filepath.Join(dir, kata.VolumeDirName(target), "sandbox-1"), nil, 0o600)
		},
		func() { _ = kata.Remove(dir, target) },
		cancel,
	}
	next := func() { steps[0](); steps = steps[1:] }
	next()
	_ = handler.WatchKataDir(ctx, dir, func(ev handler.KataEvent) error {
		if ev.Volume == nil {
			fmt.Println("removed", ev.Path)
		} else {
			fmt.Println("volume", ev.Volume.MountInfo.Device, ev.Volume.MountInfo.FsType, "sandboxes", ev.Volume.SandboxIDs)
		}
		next()
		return nil
	})
	// Output:
	// volume /dev/loop3 xfs sandboxes []
	// volume /dev/loop3 xfs sandboxes [sandbox-1]
	// removed /var/lib/kubelet/pods/p1/volumes/kubernetes.io~csi/pv1/mount
}
