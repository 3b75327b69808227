package csiproxy

import (
	"context"
	"errors"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/volume"
)

// A deferred volume means something only once a sandbox claims it from crustd. A pod of a microVM class
// whose runtime does not consume crust's descriptors runs all the same, with the empty target as its
// volume: its writes land on the node's disk (or fail, with the guard). The check below finds such
// volumes while their pod runs.

// consumeCheck is what the check for unconsumed deferred volumes keeps between passes.
type consumeCheck struct {
	mu     sync.Mutex
	warned map[string]bool // the targets warned of, until their record goes
}

// startConsumeCheck runs checkConsumed at once and then every Config.UnconsumedInterval, until ctx ends or
// stop is called; stop returns once the pass in progress, if any, has ended. Without pod look-ups (no
// phase to read), or with no interval, it runs nothing.
func (p *Proxy) startConsumeCheck(ctx context.Context) (stop func()) {
	if p.pods == nil || p.cfg.UnconsumedInterval <= 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		wait.UntilWithContext(ctx, func(ctx context.Context) { p.checkConsumed(ctx, time.Now()) }, p.cfg.UnconsumedInterval)
	}()
	return func() { cancel(); <-done }
}

// checkConsumed checks, at now, every deferred volume published more than Config.UnconsumedGrace before
// now (its record's last change) whose pod the cache holds as Running: one that crustd holds no claim
// for is unconsumed. It warns of each unconsumed volume once while its record lasts (a log line and a
// VolumeNotConsumed Event on the pod), sets crust_csi_proxy_unconsumed_volumes to how many there are, and
// answers the targets it warned of in this pass. A volume crustd cannot be asked about is left out.
func (p *Proxy) checkConsumed(ctx context.Context, now time.Time) (warned []string) {
	p.consume.mu.Lock()
	defer p.consume.mu.Unlock()
	if p.consume.warned == nil {
		p.consume.warned = map[string]bool{}
	}
	published := map[string]bool{}
	unconsumed := 0
	for _, rec := range p.journal.List() {
		if rec.Kind != KindPublish || rec.Mode != ModeDeferred || rec.Phase != PhasePublished || rec.Stale {
			continue
		}
		published[rec.Path] = true
		t, ok := volume.ParseTargetPath(rec.Path)
		if !ok || now.Sub(rec.Updated) < p.cfg.UnconsumedGrace {
			continue
		}
		pod, ok := p.pods.PodByUID(t.PodUID)
		if !ok || pod.Phase != string(corev1.PodRunning) {
			continue
		}
		claimed, err := p.claimed(ctx, rec.Path)
		if err != nil {
			p.log.Debug("unconsumed volumes: asking crustd", "target", rec.Path, "err", err)
			continue
		}
		if claimed {
			continue
		}
		unconsumed++
		if p.consume.warned[rec.Path] {
			continue
		}
		p.consume.warned[rec.Path] = true
		warned = append(warned, rec.Path)
		p.warnUnconsumed(&rec, pod)
	}
	for target := range p.consume.warned {
		if !published[target] {
			delete(p.consume.warned, target)
		}
	}
	p.metrics.SetUnconsumedVolumes(unconsumed)
	return warned
}

// claimed reports whether crustd holds a claim for the deferred volume at target; a volume crustd does
// not hold is not claimed.
func (p *Proxy) claimed(ctx context.Context, target string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r, err := p.crust.Volumes().GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: target})
	if errors.Is(err, errdefs.ErrNotFound) {
		return false, nil
	}
	return r.GetVolume().GetClaim() != nil, err
}

// warnUnconsumed logs, and records on pod, that no sandbox claims the deferred volume of rec, and where
// the pod's writes to it go: nowhere, when the guard is on the target, or the node's disk.
func (p *Proxy) warnUnconsumed(rec *Record, pod Pod) {
	writes := "land in its target path on the node's disk, not on the volume, and are moved into the quarantine " +
		"(<kubelet>/" + QuarantineDir + ") when the pod ends"
	if on, err := guarded(rec.Path); err == nil && on {
		writes = "fail: the proxy made its target path read-only (a read-only file system)"
	}
	p.log.Warn("a deferred volume is not consumed: no sandbox has claimed it while its pod runs",
		"target", rec.Path, "volume_id", rec.VolumeID, "pod", pod.Namespace+"/"+pod.Name, "runtime_class", pod.RuntimeClassName)
	p.podEvent(podRef(pod), corev1.EventTypeWarning, ReasonNotConsumed,
		"volume %s: no sandbox has claimed this deferred volume although the pod runs: the pod's runtime (RuntimeClass %q) does "+
			"not consume crust's descriptors, or no container mounts the volume; the pod's writes to the volume %s",
		rec.VolumeID, pod.RuntimeClassName, writes)
}
