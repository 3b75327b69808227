package inject

import (
	"fmt"
	"path"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// argRef is where a flag stands in a container's argv, which is its command followed by its args.
type argRef struct {
	inCommand bool
	index     int  // of the flag's name
	joined    bool // -name=value; otherwise the value is the next word
}

// findFlag returns the last occurrence of the string flag name in c's argv, in any form a Go program
// accepts (-name=value, --name=value, -name value, --name value), as the last one is the one that counts.
// It stops at "--", where flags end.
func findFlag(c *corev1.Container, name string) (value string, ref argRef, found bool) {
	words := append(append([]string(nil), c.Command...), c.Args...)
	for i := 0; i < len(words); i++ {
		w := words[i]
		if w == "--" {
			break
		}
		if !strings.HasPrefix(w, "-") {
			continue
		}
		n, v, joined := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(w, "-"), "-"), "=")
		if n != name {
			continue
		}
		r := argRef{inCommand: i < len(c.Command), index: i, joined: joined}
		if !r.inCommand {
			r.index -= len(c.Command)
		}
		if !joined {
			if i+1 >= len(words) {
				continue // a flag with no value: the program itself refuses it
			}
			v = words[i+1]
			i++
		}
		value, ref, found = v, r, true
	}
	return value, ref, found
}

// setFlag gives the string flag name the value v in c's argv: in place, in the form it had, where it
// stands already, and appended to the args as --name=v where it does not.
func setFlag(c *corev1.Container, name, v string) {
	_, ref, found := findFlag(c, name)
	if !found {
		c.Args = append(c.Args, "--"+name+"="+v)
		return
	}
	list := c.Args
	if ref.inCommand {
		list = c.Command
	}
	if ref.joined {
		dashes, _, _ := strings.Cut(list[ref.index], name)
		list[ref.index] = dashes + name + "=" + v
		return
	}
	if ref.index+1 < len(list) {
		list[ref.index+1] = v
		return
	}
	c.Args[0] = v // the value is the first of the args, the name the last word of the command
}

// env is what $(NAME) stands for in a container's command and args: the variables whose value the input
// says, from a literal or a ConfigMap it holds. A variable whose value comes from elsewhere (a field of
// the pod, a Secret, a ConfigMap the input does not hold) maps to why it cannot be known.
type env struct {
	values  map[string]string
	unknown map[string]string
}

// containerEnv works out c's variables as the kubelet does: envFrom first, then env in order, each
// value's own $(NAME) references expanded with the variables before it.
func containerEnv(c *corev1.Container, configMaps map[string]map[string]string, namespace string) env {
	e := env{values: map[string]string{}, unknown: map[string]string{}}
	set := func(name, value, why string) {
		if why != "" {
			e.unknown[name] = why
			delete(e.values, name)
			return
		}
		e.values[name] = value
		delete(e.unknown, name)
	}
	for _, from := range c.EnvFrom {
		if from.ConfigMapRef == nil {
			continue // Secrets: their keys cannot be named without the Secret
		}
		for k, v := range configMaps[namespace+"/"+from.ConfigMapRef.Name] {
			set(from.Prefix+k, v, "")
		}
	}
	for _, v := range c.Env {
		switch {
		case v.ValueFrom == nil:
			value, err := e.expand(v.Value)
			why := ""
			if err != nil {
				why = err.Error()
			}
			set(v.Name, value, why)
		case v.ValueFrom.ConfigMapKeyRef != nil:
			ref := v.ValueFrom.ConfigMapKeyRef
			value, ok := configMaps[namespace+"/"+ref.Name][ref.Key]
			why := ""
			if !ok {
				why = fmt.Sprintf("it comes from key %q of ConfigMap %s, which the input does not hold", ref.Key, ref.Name)
			}
			set(v.Name, value, why)
		default:
			set(v.Name, "", "it comes from a field, a resource or a Secret, known only on the node")
		}
	}
	return e
}

// expand replaces each $(NAME) in s with the variable's value, and $$ with $, as the kubelet does; a
// reference to a variable that is not defined at all stays as it is, as it does for the kubelet.
func (e env) expand(s string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String(), nil
			}
			name := s[i+2 : i+end]
			if why, ok := e.unknown[name]; ok {
				return "", fmt.Errorf("$(%s) cannot be resolved: %s", name, why)
			}
			if v, ok := e.values[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+end+1])
			}
			i += end
		default:
			b.WriteByte('$')
		}
	}
	return b.String(), nil
}

// socketPath turns a CSI address (unix:///csi/csi.sock, unix:/csi/csi.sock, /csi/csi.sock) into the
// path it names.
func socketPath(address string) (string, error) {
	p := address
	switch {
	case strings.HasPrefix(p, "unix://"):
		p = strings.TrimPrefix(p, "unix://")
	case strings.HasPrefix(p, "unix:"):
		p = strings.TrimPrefix(p, "unix:")
	case strings.Contains(p, "://"):
		return "", fmt.Errorf("address %q is not a unix socket", address)
	}
	if !path.IsAbs(p) {
		return "", fmt.Errorf("address %q is not an absolute path", address)
	}
	return path.Clean(p), nil
}
