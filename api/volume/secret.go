package volume

import (
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	crustv1 "crust.dev/crust/api/crust/v1"
)

// secretWords make a key secret when its lower-cased form contains one of them.
var secretWords = []string{"secret", "pass", "token", "key", "credential", "auth", "private", "cert"}

// IsSecretKey reports whether the value of a metadata key, volume context key or StorageClass parameter
// is secret: never logged, never in an answer but the claiming handler's (ClaimVolume), never printed.
// It errs on the side of secrecy: EncryptionKey and any key containing (in any case) secret, pass
// (password, passphrase, passwd), token (ServiceAccountTokensKey), key, credential, auth, private or cert
// are secret.
func IsSecretKey(key string) bool {
	k := strings.ToLower(key)
	for _, w := range secretWords {
		if strings.Contains(k, w) {
			return true
		}
	}
	return false
}

// Redacted is what Redact, RedactVolume and StripSecrets put in place of a secret value: the key stays,
// so that a reader sees that the volume has one (an encrypted volume, say), but never the value.
const Redacted = "<redacted>"

// Redact returns md when it holds no secret key, else a copy in which the value of every key IsSecretKey
// reports is Redacted. md is never changed. A nil map gives nil.
func Redact(md map[string]string) map[string]string {
	if !hasSecret(md) {
		return md
	}
	out := make(map[string]string, len(md))
	for k, val := range md {
		if IsSecretKey(k) {
			val = Redacted
		}
		out[k] = val
	}
	return out
}

// RedactVolume returns v when its metadata holds no secret key, else a copy whose secret metadata values
// are Redacted (see Redact). v is never changed. crustd answers every call but ClaimVolume through it.
func RedactVolume(v *crustv1.Volume) *crustv1.Volume {
	if !hasSecret(v.GetSpec().GetMetadata()) {
		return v
	}
	c := proto.CloneOf(v)
	c.Spec.Metadata = Redact(c.Spec.Metadata)
	return c
}

func hasSecret(md map[string]string) bool {
	for k := range md {
		if IsSecretKey(k) {
			return true
		}
	}
	return false
}

// StripSecrets returns m, or a copy of m fit to log: every field the CSI spec marks csi_secret (at any
// depth; for a map, every value) is Redacted (strings) or cleared (other kinds), and so is every value of
// a string map (metadata, volume_context, publish_context, parameters) whose key IsSecretKey reports. m is
// never changed. It is the one function through which crustd, the CSI proxy and crust's CSI driver log
// requests.
func StripSecrets(m proto.Message) proto.Message {
	if m == nil {
		return nil
	}
	c := proto.Clone(m)
	if !strip(c.ProtoReflect()) {
		return m
	}
	return c
}

func isCSISecret(fd protoreflect.FieldDescriptor) bool {
	opts := fd.Options()
	if opts == nil {
		return false
	}
	b, _ := proto.GetExtension(opts, csi.E_CsiSecret).(bool)
	return b
}

// strip redacts m's secrets in place and reports whether it found any.
func strip(m protoreflect.Message) bool {
	found := false
	var secrets, maps []protoreflect.FieldDescriptor
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case isCSISecret(fd):
			secrets = append(secrets, fd)
		case fd.IsMap() && fd.MapKey().Kind() == protoreflect.StringKind && fd.MapValue().Kind() == protoreflect.StringKind:
			maps = append(maps, fd)
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				found = strip(mv.Message()) || found
				return true
			})
		case fd.IsList() && fd.Message() != nil:
			for i := 0; i < v.List().Len(); i++ {
				found = strip(v.List().Get(i).Message()) || found
			}
		case fd.Message() != nil && !fd.IsList() && !fd.IsMap():
			found = strip(v.Message()) || found
		}
		return true
	})
	for _, fd := range maps {
		mp := m.Mutable(fd).Map()
		var keys []protoreflect.MapKey
		mp.Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool {
			if IsSecretKey(k.String()) {
				keys = append(keys, k)
			}
			return true
		})
		for _, k := range keys {
			mp.Set(k, protoreflect.ValueOfString(Redacted))
		}
		found = found || len(keys) > 0
	}
	for _, fd := range secrets {
		found = true
		switch {
		case fd.IsMap() && fd.MapValue().Kind() == protoreflect.StringKind:
			mp := m.Mutable(fd).Map()
			var keys []protoreflect.MapKey
			mp.Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool { keys = append(keys, k); return true })
			for _, k := range keys {
				mp.Set(k, protoreflect.ValueOfString(Redacted))
			}
		case !fd.IsList() && !fd.IsMap() && fd.Kind() == protoreflect.StringKind:
			m.Set(fd, protoreflect.ValueOfString(Redacted))
		default:
			m.Clear(fd)
		}
	}
	return found
}
