package validate

import (
	"fmt"
	"net/url"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"

	"crust.dev/crust/api/volume"

	"crust.dev/crust/api/errdefs"
)

// Limits on a spec's fields.
const (
	maxMountFlags       = 32
	maxMountFlagLen     = 256
	maxMetadataPairs    = 16
	maxMetadataKeyLen   = 253
	maxMetadataValueLen = 4096
	maxVolumeIDLen      = 256
	maxCSIDriverLen     = 63
	maxPodUIDLen        = 36
	maxSandboxIDLen     = 128
	maxSocketPathLen    = 107 // sizeof(sun_path) less the terminating NUL
)

// bindLike are mount options that would make a mount a bind mount, move it, remount it, or change its
// propagation; "make-*" is refused as well.
var bindLike = map[string]bool{
	"bind": true, "rbind": true, "move": true, "remount": true,
	"shared": true, "rshared": true, "slave": true, "rslave": true,
	"private": true, "rprivate": true, "unbindable": true, "runbindable": true,
}

func fsType(field, t string) error {
	if volume.IsFSType(t) {
		return nil
	}
	if t == "" {
		return errdefs.Field(field, "is required; one of %s", strings.Join(volume.FSTypes(), ", "))
	}
	return errdefs.Field(field, "%q is not one of %s", t, strings.Join(volume.FSTypes(), ", "))
}

// mountFlags checks the mount options: at most maxMountFlags, each one option of printable ASCII without
// spaces or commas, at most maxMountFlagLen bytes, not bind-like, not a PrivilegedMountOptions option
// that allowed does not hold, not "ro"/"rw" against readOnly, and no option twice.
func mountFlags(field string, flags []string, readOnly bool, allowed map[string]bool) error {
	if len(flags) > maxMountFlags {
		return errdefs.Field(field, "has %d options; at most %d", len(flags), maxMountFlags)
	}
	seen := make(map[string]bool, len(flags))
	for i, f := range flags {
		ff := fmt.Sprintf("%s[%d]", field, i)
		if f == "" {
			return errdefs.Field(ff, "is empty")
		}
		if err := maxLen(ff, f, maxMountFlagLen); err != nil {
			return err
		}
		if !utf8.ValidString(f) {
			return errdefs.Field(ff, "is not valid UTF-8")
		}
		if strings.IndexByte(f, ',') >= 0 {
			return errdefs.Field(ff, "%q contains a comma; give one option per entry", f)
		}
		for _, r := range f {
			if r <= ' ' || r > '~' {
				return errdefs.Field(ff, "contains %q; an option is printable ASCII without spaces", r)
			}
		}
		name, _, _ := strings.Cut(strings.ToLower(f), "=")
		if bindLike[name] || strings.HasPrefix(name, "make-") {
			return errdefs.Field(ff, "%q is a bind, move, remount or propagation option, which is not allowed", f)
		}
		if slices.Contains(PrivilegedMountOptions, strings.ToLower(f)) && !allowed[strings.ToLower(f)] {
			return errdefs.Field(ff, "%q would let the volume bring device files or set-user-id programs into the sandbox; "+
				"it is refused unless the operator allows it (crustd --allow-mount-option %s)", f, strings.ToLower(f))
		}
		if f == "ro" && !readOnly {
			return errdefs.Field(ff, `"ro" contradicts read_only=false; set read_only instead`)
		}
		if f == "rw" && readOnly {
			return errdefs.Field(ff, `"rw" contradicts read_only=true`)
		}
		if seen[f] {
			return errdefs.Field(ff, "%q is given twice", f)
		}
		seen[f] = true
	}
	return nil
}

func volumeID(field, id string) error {
	if err := maxLen(field, id, maxVolumeIDLen); err != nil {
		return err
	}
	return printable(field, id)
}

// printable refuses invalid UTF-8 and control characters.
func printable(field, s string) error {
	if !utf8.ValidString(s) {
		return errdefs.Field(field, "is not valid UTF-8")
	}
	if i := strings.IndexFunc(s, unicode.IsControl); i >= 0 {
		r, _ := utf8.DecodeRuneInString(s[i:])
		return errdefs.Field(field, "contains the control character %q", r)
	}
	return nil
}

// csiDriver accepts an empty name or a CSI plugin name: at most 63 characters, alphanumerics, '-' and
// '.', beginning and ending with an alphanumeric.
func csiDriver(field, name string) error {
	if name == "" {
		return nil
	}
	if err := maxLen(field, name, maxCSIDriverLen); err != nil {
		return err
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !alnum(c) && ((c != '-' && c != '.') || i == 0 || i == len(name)-1) {
			return errdefs.Field(field, "%q is not a CSI driver name (alphanumerics, '-' and '.', beginning and "+
				"ending with an alphanumeric)", name)
		}
	}
	return nil
}

// podUID accepts an empty uid or up to 36 characters of [0-9a-f-], the form of a Kubernetes UID.
func podUID(field, uid string) error {
	if err := maxLen(field, uid, maxPodUIDLen); err != nil {
		return err
	}
	for i := 0; i < len(uid); i++ {
		c := uid[i]
		lowerHex := '0' <= c && c <= '9' || 'a' <= c && c <= 'f'
		if !lowerHex && c != '-' {
			return errdefs.Field(field, "%q is not a pod UID (lower-case hex digits and '-')", uid)
		}
	}
	return nil
}

// metadata checks the pairs: at most maxMetadataPairs, keys at most maxMetadataKeyLen bytes and on the
// allow-list (the Kata keys with a typed field never are), values at most maxMetadataValueLen bytes of
// valid UTF-8. Keys are checked in sorted order so that the same map always gives the same error.
func (v *Validator) metadata(field string, md map[string]string) error {
	if len(md) > maxMetadataPairs {
		return errdefs.Field(field, "has %d pairs; at most %d", len(md), maxMetadataPairs)
	}
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k == "" {
			return errdefs.Field(field, "has an empty key")
		}
		if len(k) > maxMetadataKeyLen {
			return errdefs.Field(field, "has a key of %d bytes (%q...); at most %d",
				len(k), truncate(k, 32), maxMetadataKeyLen)
		}
		kf := fmt.Sprintf("%s[%q]", field, k)
		if k == volume.CreateFilesystemKey {
			if val := md[k]; val != "true" && val != "false" {
				return errdefs.Field(kf, "is %q; want \"true\" or \"false\" (or set spec.create_filesystem)", truncate(val, 32))
			}
			continue
		}
		if typed := volume.TypedField(k); typed != "" {
			return errdefs.Field(kf, "is not allowed as metadata: set the typed field spec.%s instead", typed)
		}
		if !v.metaKeys[k] {
			return errdefs.Field(kf, "is not an allowed metadata key (allowed: %s)", strings.Join(v.allowedKeys(), ", "))
		}
		if val := md[k]; len(val) > maxMetadataValueLen {
			return errdefs.Field(kf, "has a value of %d bytes; at most %d", len(val), maxMetadataValueLen)
		} else if !utf8.ValidString(val) {
			return errdefs.Field(kf, "has a value that is not valid UTF-8")
		}
	}
	return nil
}

func (v *Validator) allowedKeys() []string {
	keys := make([]string, 0, len(v.metaKeys))
	for k := range v.metaKeys {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// required refuses s, the value of field, when it is empty or longer than n bytes.
func required(field, s string, n int) error {
	if s == "" {
		return errdefs.Field(field, "is required")
	}
	return maxLen(field, s, n)
}

// maxLen refuses s, the value of field, when it is longer than n bytes.
func maxLen(field, s string, n int) error {
	if len(s) > n {
		return errdefs.Field(field, "is %d bytes long; at most %d", len(s), n)
	}
	return nil
}

func alnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "")
}

// SandboxID checks a sandbox id, which becomes a file name in a Kata volume directory: 1 to 128
// characters of [A-Za-z0-9._-], not beginning with '.', and not "mountInfo.json". A refusal is a
// *errdefs.FieldError naming field.
func SandboxID(field, id string) error {
	if err := required(field, id, maxSandboxIDLen); err != nil {
		return err
	}
	switch {
	case id[0] == '.':
		return errdefs.Field(field, "%q begins with '.'", id)
	case id == "mountInfo.json":
		return errdefs.Field(field, `"mountInfo.json" is the name of Kata's descriptor file, not a sandbox id`)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !alnum(c) && c != '.' && c != '_' && c != '-' {
			return errdefs.Field(field, "%q has a character other than letters, digits, '.', '_' and '-'", id)
		}
	}
	return nil
}

// HandlerEndpoint checks the address crustd will dial to reach a runtime handler. Empty is accepted (a
// claim with no endpoint). Otherwise it must be unix:///absolute/path or unix:/absolute/path, where the
// path is clean, at most 107 bytes (a socket address's limit), and free of control characters and of
// '%', '?' and '#' (so that gRPC's URL parsing dials exactly that path). Nothing else is accepted, in
// particular no TCP or DNS target, so that crustd cannot be pointed at the network. A refusal is a
// *errdefs.FieldError naming field. It reads nothing of the filesystem: whether crustd can see the
// socket is HandlerSockets' question, asked once the claim's volume is known.
func HandlerEndpoint(field, ep string) error {
	if ep == "" {
		return nil
	}
	const want = "an endpoint is unix:///absolute/path or unix:/absolute/path"
	rest, ok := strings.CutPrefix(ep, "unix:")
	if !ok {
		return errdefs.Field(field, "%q is not a unix socket address; %s", truncate(ep, 64), want)
	}
	path := rest
	if p, ok := strings.CutPrefix(rest, "//"); ok {
		if p != "" && !strings.HasPrefix(p, "/") {
			return errdefs.Field(field, "%q names a host; %s", truncate(ep, 64), want)
		}
		path = p
	}
	if path == "" {
		return errdefs.Field(field, "%q has no socket path; %s", ep, want)
	}
	if len(path) > maxSocketPathLen {
		return errdefs.Field(field, "has a socket path of %d bytes; at most %d", len(path), maxSocketPathLen)
	}
	if err := printable(field, path); err != nil {
		return err
	}
	if i := strings.IndexAny(path, "%?#"); i >= 0 {
		return errdefs.Field(field, "%q contains %q", ep, path[i])
	}
	if !strings.HasPrefix(path, "/") {
		return errdefs.Field(field, "%q has a relative socket path; %s", ep, want)
	}
	if c := filepath.Clean(path); c != path {
		return errdefs.Field(field, "%q has a socket path that is not clean (it would be %q)", ep, c)
	}
	// Belt and braces: gRPC parses the target as a URL; it must dial exactly this path.
	u, err := url.Parse(ep)
	if err != nil || u.Scheme != "unix" || u.Host != "" || u.User != nil || (u.Path != path && u.Opaque != path) {
		return errdefs.Field(field, "%q does not parse as a unix socket address; %s", ep, want)
	}
	return nil
}
