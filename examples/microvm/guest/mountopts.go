//go:build linux

package guest

import "golang.org/x/sys/unix"

// mountOpts is a container mount's mount(8)-style option list split into what mount(2) takes: flags
// (volumes.go's mountFlags), the propagation to apply after mounting, and the filesystem's own options
// (mode=, size=, ...).
type mountOpts struct {
	flags       uintptr
	propagation uintptr // MS_PRIVATE, MS_SLAVE, ... with MS_REC for the r forms; 0 for none
	bind        bool    // bind or rbind
	recursive   bool    // rbind
	data        []string
}

var propagations = map[string]uintptr{
	"private": unix.MS_PRIVATE, "rprivate": unix.MS_PRIVATE | unix.MS_REC,
	"shared": unix.MS_SHARED, "rshared": unix.MS_SHARED | unix.MS_REC,
	"slave": unix.MS_SLAVE, "rslave": unix.MS_SLAVE | unix.MS_REC,
	"unbindable": unix.MS_UNBINDABLE, "runbindable": unix.MS_UNBINDABLE | unix.MS_REC,
}

// parseMountOptions splits options; the type "bind" counts as the option bind.
func parseMountOptions(typ string, options []string) mountOpts {
	o := mountOpts{bind: typ == "bind"}
	for _, opt := range options {
		if f, ok := mountFlags[opt]; ok {
			if f.set {
				o.flags |= f.flags
			} else {
				o.flags &^= f.flags
			}
			continue
		}
		if p, ok := propagations[opt]; ok {
			o.propagation = p
			continue
		}
		switch opt {
		case "bind":
			o.bind = true
		case "rbind":
			o.bind, o.recursive = true, true
		case "":
		default:
			o.data = append(o.data, opt)
		}
	}
	return o
}
