package guest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"crust.dev/crust/api/errdefs"
	crustvolume "crust.dev/crust/api/volume"
	"crust.dev/crust/examples/microvm/agentproto"
	"crust.dev/crust/examples/microvm/agentproto/agentv1"
)

// cryptsetup's exit status for a passphrase that opens no keyslot.
const cryptsetupNoKey = 2

// mappingName is the dm-crypt mapping of the disk of serial: dm names may hold neither '/' nor spaces,
// so a serial with other characters than these is refused.
var mappingName = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

// openCrypt opens the LUKS2 volume on disk dev (serial) with enc's key and returns the mapping's device
// node (/dev/dm-N) and whether it formatted the disk. A blank disk is formatted as LUKS2 when
// create_filesystem asks; a disk that holds anything but LUKS is never touched; a key that opens no
// keyslot is FailedPrecondition, with nothing changed. An open mapping of the same disk is used again.
func (v *volumes) openCrypt(ctx context.Context, dev string, args *agentv1.MountRequest) (string, bool, error) {
	enc := args.Encryption
	name := "crust-" + args.Serial
	switch {
	case len(enc.Key) == 0 || len(enc.Key) > crustvolume.MaxEncryptionKey:
		return "", false, agentproto.Errorf(errdefs.ErrInvalidArgument, "encryption.key must be 1 to %d bytes", crustvolume.MaxEncryptionKey)
	case !mappingName.MatchString(args.Serial):
		return "", false, agentproto.Errorf(errdefs.ErrInvalidArgument, "serial %q: an encrypted volume's serial holds only letters, digits, '.', '_' and '-'", args.Serial)
	case args.PmemAddress != 0:
		return "", false, agentproto.Errorf(errdefs.ErrUnimplemented, "encrypting a persistent-memory volume (DAX cannot pass through dm-crypt)")
	}
	if err := v.ready(ctx); err != nil { // dm-crypt and dm-integrity are modules
		return "", false, err
	}
	if err := os.MkdirAll("/run/cryptsetup", 0o700); err != nil { // cryptsetup's locks
		return "", false, fmt.Errorf("%v", err)
	}
	if mapped, backing, ok := mapping(name); ok {
		if !sameDevice(backing, dev) {
			return "", false, agentproto.Errorf(errdefs.ErrFailedPrecondition, "mapping %s is open on %s, not %s", name, backing, dev)
		}
		return mapped, false, nil
	}
	formatted := false
	res, err := v.procs.run(ctx, []string{"cryptsetup", "isLuks", "--type", "luks2", dev}, time.Minute)
	if err != nil {
		return "", false, err
	}
	if res.status != 0 {
		found, err := v.probe(ctx, dev)
		switch {
		case err != nil:
			return "", false, err
		case found != "":
			return "", false, agentproto.Errorf(errdefs.ErrFailedPrecondition, "%s (serial %s) holds %s, not a LUKS2 volume: it is never formatted", dev, args.Serial, found)
		case !args.CreateFilesystem || args.ReadOnly:
			return "", false, agentproto.Errorf(errdefs.ErrFailedPrecondition, "%s (serial %s) is blank and may not be formatted (create_filesystem off, or read-only)", dev, args.Serial)
		}
		argv := []string{"cryptsetup", "luksFormat", "--batch-mode", "--type", "luks2", "--key-file=-",
			// Argon2id within a small guest's memory: 64 MiB, not cryptsetup's default of up to 1 GiB.
			"--pbkdf", "argon2id", "--pbkdf-memory", "65536"}
		if enc.Integrity {
			argv = append(argv, "--integrity", "hmac-sha256")
		}
		start := time.Now()
		if _, err := v.procs.runToolInput(ctx, enc.Key, append(argv, dev)...); err != nil {
			return "", false, err
		}
		formatted = true
		logger.Printf("formatted %s (serial %s) as LUKS2 (integrity %v) in %.2fs", dev, args.Serial, enc.Integrity, time.Since(start).Seconds())
	}
	argv := []string{"cryptsetup", "open", "--type", "luks2", "--key-file=-"}
	if args.ReadOnly {
		argv = append(argv, "--readonly")
	}
	res, err = v.procs.runInput(ctx, append(argv, dev, name), 10*time.Minute, enc.Key)
	switch {
	case err != nil:
		return "", false, err
	case res.status == cryptsetupNoKey:
		return "", false, agentproto.Errorf(errdefs.ErrFailedPrecondition, "the key opens no keyslot of the LUKS2 volume on %s (serial %s): wrong key", dev, args.Serial)
	case res.status != 0:
		return "", false, fmt.Errorf("cryptsetup open %s exited with %d: %s", dev, res.status, res.stderr)
	}
	mapped, _, ok := mapping(name)
	if !ok {
		return "", false, fmt.Errorf("cryptsetup opened %s as %s, and no dm device has that name", dev, name)
	}
	return mapped, formatted, nil
}

// closeCrypt closes the mapping name; one that is not open is no error.
func (v *volumes) closeCrypt(ctx context.Context, name string) error {
	if _, _, ok := mapping(name); !ok {
		return nil
	}
	_, err := v.procs.runTool(ctx, "cryptsetup", "close", name)
	return err
}

// resizeCrypt grows vol's open mapping to fill its disk, which has grown; a volume with dm-integrity
// under its mapping is not grown (Unimplemented).
func (v *volumes) resizeCrypt(ctx context.Context, vol *volume) error {
	if vol.integrity {
		return agentproto.Errorf(errdefs.ErrUnimplemented, "growing an integrity-protected volume (dm-integrity's tags do not grow online)")
	}
	_, err := v.procs.runToolInput(ctx, vol.key, "cryptsetup", "resize", "--key-file=-", vol.mapping)
	return err
}

// mapping finds the dm device named name: its node (/dev/dm-N) and the node of the disk under it, through
// the dm-integrity device an integrity-protected volume has between them.
func mapping(name string) (dev, backing string, ok bool) {
	dirs, _ := filepath.Glob("/sys/block/dm-*")
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "dm", "name"))
		if err != nil || strings.TrimSpace(string(b)) != name {
			continue
		}
		for under := filepath.Base(d); ; {
			slaves, _ := os.ReadDir(filepath.Join("/sys/block", under, "slaves"))
			if len(slaves) != 1 {
				return "/dev/" + filepath.Base(d), backing, true
			}
			under = slaves[0].Name()
			backing = "/dev/" + under
		}
	}
	return "", "", false
}
