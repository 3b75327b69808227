package client_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"crust.dev/crust/api/client"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/volume"
)

// runtimes is a client.PodRuntimes from a map of "namespace/name" to handler; a pod is known only after
// it has been asked for more than late[key] times, as a pod an informer has not caught up with.
type runtimes struct {
	handlers map[string]string
	late     map[string]int
	asked    map[string]int
}

func (r *runtimes) RuntimeHandler(pod client.Pod) (string, bool) {
	key := pod.Namespace + "/" + pod.Name
	if r.asked == nil {
		r.asked = map[string]int{}
	}
	if r.asked[key]++; r.asked[key] <= r.late[key] {
		return "", false
	}
	h, ok := r.handlers[key]
	return h, ok
}

func mountCap() *csi.VolumeCapability {
	return &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}}}
}

func withPod(name string) map[string]string {
	return map[string]string{volume.DeferKey: "true", volume.PodNamespaceKey: "ns", volume.PodNameKey: name}
}

func TestDeferralDecide(t *testing.T) {
	pods := &runtimes{handlers: map[string]string{"ns/runc": "", "ns/kata": "kata-qemu", "ns/gvisor": "runsc"}}
	block := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}}
	perPod := client.Deferral{Handlers: client.Handlers{"kata-*"}, Pods: pods}
	withDefault := perPod
	withDefault.DefaultHandler = "kata-clh"
	for _, tc := range []struct {
		name   string
		d      client.Deferral
		c      *csi.VolumeCapability
		volCtx map[string]string
		want   client.Decision
	}{
		{"no flag", perPod, mountCap(), map[string]string{}, client.PassThrough},
		{"flag false", perPod, mountCap(), map[string]string{volume.DeferKey: "false"}, client.PassThrough},
		{"flag garbage", perPod, mountCap(), map[string]string{volume.DeferKey: "yes"}, client.PassThrough},
		{"raw block", perPod, block, withPod("kata"), client.PassThrough},
		{"no capability", perPod, nil, withPod("kata"), client.PassThrough},
		{"zero value defers", client.Deferral{}, mountCap(), withPod("runc"), client.Defer},
		{"runc pod", perPod, mountCap(), withPod("runc"), client.HostMount},
		{"microVM pod", perPod, mountCap(), withPod("kata"), client.Defer},
		{"another sandbox", perPod, mountCap(), withPod("gvisor"), client.HostMount},
		{"no class on a microVM node", withDefault, mountCap(), withPod("runc"), client.Defer},
		{"a class beats the node's default", withDefault, mountCap(), withPod("gvisor"), client.HostMount},
	} {
		got, why, err := tc.d.Decide(context.Background(), tc.c, tc.volCtx)
		if err != nil || got != tc.want || why == "" {
			t.Errorf("%s: Decide = %v (%q), %v; want %v with a reason", tc.name, got, why, err, tc.want)
		}
	}
	// Pods are looked up, but the context names none (a CSIDriver without podInfoOnMount): no guess.
	if got, _, err := perPod.Decide(context.Background(), mountCap(), map[string]string{volume.DeferKey: "1"}); got == client.Defer ||
		!errors.Is(err, client.ErrNoPodInfo) || !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "podInfoOnMount: true") {
		t.Errorf("no pod info: %v, %v; want ErrNoPodInfo, of kind FailedPrecondition, saying to set podInfoOnMount", got, err)
	}
	if _, why, _ := perPod.Decide(context.Background(), block, withPod("kata")); why != client.ReasonRawBlock {
		t.Errorf("raw block reason %q", why)
	}
	// An encrypting volume: deferred for a microVM pod, refused for one on the host, never host-mounted.
	encrypted := func(pod string, extra ...string) map[string]string {
		m := withPod(pod)
		m[volume.EncryptionParamKey] = "luks2"
		for i := 0; i+1 < len(extra); i += 2 {
			m[extra[i]] = extra[i+1]
		}
		return m
	}
	if got, _, err := perPod.Decide(context.Background(), mountCap(), encrypted("kata")); err != nil || got != client.Defer {
		t.Errorf("encrypted, microVM pod: %v, %v; want defer", got, err)
	}
	for _, pod := range []string{"runc", "gvisor"} {
		got, _, err := perPod.Decide(context.Background(), mountCap(), encrypted(pod))
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "ns/"+pod) || got == client.HostMount {
			t.Errorf("encrypted, pod %s on the host: %v, %v; want FailedPrecondition naming the pod", pod, got, err)
		}
	}
	var fe *errdefs.FieldError
	if _, _, err := perPod.Decide(context.Background(), mountCap(), encrypted("runc", volume.EncryptionIntegrityKey, "yes")); !errors.As(err, &fe) ||
		fe.Field != volume.EncryptionIntegrityKey {
		t.Errorf("malformed integrity on the host: %v; want a field error naming %s", err, volume.EncryptionIntegrityKey)
	}
}

// A pod the look-ups learn of late is waited for, within PodWait; one never learnt of is ErrPodNotSeen,
// an Unavailable error (kubelet retries), and so is one still unknown when ctx ends.
func TestDeferralWaitsForThePod(t *testing.T) {
	pods := &runtimes{handlers: map[string]string{"ns/late": "kata"}, late: map[string]int{"ns/late": 3}}
	d := client.Deferral{Handlers: client.Handlers{"kata"}, Pods: pods, PodWait: 1 << 62}
	if got, why, err := d.Decide(context.Background(), mountCap(), withPod("late")); err != nil || got != client.Defer {
		t.Fatalf("late pod: %v (%s), %v; want defer", got, why, err)
	}
	if pods.asked["ns/late"] != 4 {
		t.Fatalf("asked %d times; want 4", pods.asked["ns/late"])
	}
	d.PodWait = 0
	_, _, err := d.Decide(context.Background(), mountCap(), withPod("never"))
	if !errors.Is(err, client.ErrPodNotSeen) || !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "ns/never") {
		t.Fatalf("unknown pod: %v; want ErrPodNotSeen naming ns/never", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	d.PodWait = 1 << 62
	if _, _, err := d.Decide(ctx, mountCap(), withPod("never")); !errors.Is(err, client.ErrPodNotSeen) || !errors.Is(err, context.Canceled) {
		t.Fatalf("unknown pod, ctx ended: %v", err)
	}
}

// The patterns a proxy or driver is given match every handler kata-deploy creates and crust-microvm,
// and nothing else; Decide names the pattern that matched.
func TestHandlersMatch(t *testing.T) {
	defaults, err := client.ParseHandlers([]string{"kata", "kata-*", "crust-microvm"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		handlers client.Handlers
		handler  string
		want     string // the pattern that matches; "" for none
	}{
		{defaults, "kata", "kata"},
		{defaults, "kata-qemu", "kata-*"},
		{defaults, "kata-clh", "kata-*"},
		{defaults, "kata-fc", "kata-*"},
		{defaults, "kata-dragonball", "kata-*"},
		{defaults, "kata-qemu-runtime-rs", "kata-*"},
		{defaults, "kata-qemu-tdx", "kata-*"},
		{defaults, "kata-qemu-snp", "kata-*"},
		{defaults, "kata-qemu-coco-dev", "kata-*"},
		{defaults, "kata-qemu-nvidia-gpu", "kata-*"},
		{defaults, "crust-microvm", "crust-microvm"},
		{defaults, "runc", ""},
		{defaults, "runsc", ""},
		{defaults, "gvisor", ""},
		{defaults, "katana", ""}, // neither kata nor kata-*
		{defaults, "kata-", "kata-*"},
		{defaults, "my-kata", ""},
		{defaults, "crust-microvm-2", ""},
		{client.Handlers{"kata-qemu?"}, "kata-qemu2", "kata-qemu?"},
		{client.Handlers{"kata-[cf]*"}, "kata-clh", "kata-[cf]*"},
		{client.Handlers{"kata-[cf]*"}, "kata-qemu", ""},
		{nil, "kata", ""},
	} {
		got, ok := tc.handlers.Match(tc.handler)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("%v.Match(%q) = %q, %v; want %q", tc.handlers, tc.handler, got, ok, tc.want)
		}
		d := client.Deferral{Handlers: tc.handlers, Pods: &runtimes{handlers: map[string]string{"ns/p": tc.handler}}}
		got2, why, err := d.Decide(context.Background(), mountCap(), withPod("p"))
		switch {
		case err != nil:
			t.Errorf("handler %q: %v", tc.handler, err)
		case tc.want != "" && (got2 != client.Defer || !strings.Contains(why, "pattern "+tc.want+")")):
			t.Errorf("handler %q: %v (%s); want defer naming pattern %s", tc.handler, got2, why, tc.want)
		case tc.want == "" && got2 != client.HostMount:
			t.Errorf("handler %q: %v (%s); want host-mount", tc.handler, got2, why)
		}
	}
}

// A malformed pattern is refused, named; empty ones are dropped.
func TestParseHandlers(t *testing.T) {
	for _, bad := range []string{"kata-[", "kata-[]", `kata\`} {
		if _, err := client.ParseHandlers([]string{"kata", bad}); err == nil || !strings.Contains(err.Error(), strconv.Quote(bad)) {
			t.Errorf("ParseHandlers(%q) = %v; want an error naming the pattern", bad, err)
		}
	}
	h, err := client.ParseHandlers([]string{"", "kata", ""})
	if err != nil || len(h) != 1 || h[0] != "kata" {
		t.Errorf("ParseHandlers = %v, %v; want [kata]", h, err)
	}
}
