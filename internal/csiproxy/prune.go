package csiproxy

import (
	"context"
	"errors"
	"io/fs"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"crust.dev/crust/api/safedir"
)

// The quarantine is bounded: a quarantined target older than Config.QuarantineMaxAge is deleted, and so
// are the oldest ones while the quarantine holds more than Config.QuarantineMaxBytes, each deletion
// logged at Warn; crust_csi_proxy_quarantine_bytes and crust_csi_proxy_quarantine_limit_bytes say how
// full it is, and the alert CrustQuarantineFilling fires before the bound is reached, so that an operator
// has time to recover what is needed.

// pruneInterval is how often the quarantine is measured and kept within its bounds (and after every
// target quarantined).
const pruneInterval = 10 * time.Minute

// quarantined is one quarantined target: <kubelet>/crust-quarantine/<pod>/<name>.
type quarantined struct {
	pod, name string
	at        time.Time
	bytes     int64
}

// startPrune runs pruneQuarantine at once and then every pruneInterval, until ctx ends or stop is called;
// stop returns once the pass in progress has ended. A zero bound of both kinds runs nothing.
func (p *Proxy) startPrune(ctx context.Context) (stop func()) {
	if p.cfg.QuarantineMaxAge <= 0 && p.cfg.QuarantineMaxBytes <= 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		wait.UntilWithContext(ctx, func(context.Context) {
			if err := p.pruneQuarantine(time.Now()); err != nil {
				p.log.Error("keep the quarantine within its bounds", "err", err)
			}
		}, pruneInterval)
	}()
	return func() { cancel(); <-done }
}

// pruneQuarantine deletes, at now, the quarantined targets past Config.QuarantineMaxAge (0: no bound),
// then the oldest while the rest hold more than Config.QuarantineMaxBytes (0: no bound), and a pod's
// directory left empty; it sets the quarantine's metrics. A quarantine that does not exist is empty;
// without Config.KubeletDir nothing is done.
// Nothing is followed through a link, and an entry that is not a directory of quarantineName's shape is
// dated by its modification time.
func (p *Proxy) pruneQuarantine(now time.Time) error {
	if p.cfg.KubeletDir == "" {
		return nil
	}
	p.pruneMu.Lock()
	defer p.pruneMu.Unlock()
	root, err := safedir.Open(p.cfg.KubeletDir)
	if err != nil {
		return err
	}
	defer func() { _ = root.Close() }()
	q, err := root.OpenDir(QuarantineDir)
	if errors.Is(err, fs.ErrNotExist) {
		p.metrics.SetQuarantine(0, p.cfg.QuarantineMaxBytes, 0)
		return nil
	}
	if err != nil {
		return err
	}
	defer func() { _ = q.Close() }()
	if err := q.CheckOwned(); err != nil {
		return err
	}
	entries, total, err := quarantineEntries(q)
	if err != nil {
		return err
	}
	pruned := 0
	var errs []error
	for _, e := range entries {
		old := p.cfg.QuarantineMaxAge > 0 && now.Sub(e.at) > p.cfg.QuarantineMaxAge
		full := p.cfg.QuarantineMaxBytes > 0 && total > p.cfg.QuarantineMaxBytes
		if !old && !full {
			continue
		}
		pod, err := q.OpenDir(e.pod)
		if err == nil {
			err = errors.Join(pod.RemoveAll(e.name), pod.Close())
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		_ = q.RemoveEmptyDir(e.pod) // a pod directory that still holds a target stays
		total -= e.bytes
		pruned++
		p.log.Warn("deleted a quarantined target to keep the quarantine within its bounds", "path", q.Join(e.pod+"/"+e.name),
			"quarantined_at", e.at, "bytes", e.bytes, "past_max_age", old, "max_age", p.cfg.QuarantineMaxAge,
			"max_bytes", p.cfg.QuarantineMaxBytes)
	}
	p.metrics.SetQuarantine(total, p.cfg.QuarantineMaxBytes, pruned)
	return errors.Join(errs...)
}

// quarantineEntries lists the quarantined targets in q, oldest first, and the bytes they hold in all.
func quarantineEntries(q *safedir.Dir) ([]quarantined, int64, error) {
	pods, err := q.Names()
	if err != nil {
		return nil, 0, err
	}
	var out []quarantined
	var total int64
	for _, uid := range pods {
		entries, err := podEntries(q, uid)
		if err != nil {
			return nil, 0, err
		}
		for _, e := range entries {
			out = append(out, e)
			total += e.bytes
		}
	}
	slices.SortFunc(out, func(a, b quarantined) int { return a.at.Compare(b.at) })
	return out, total, nil
}

// podEntries lists the quarantined targets of pod uid in q; an entry of q that is no directory holds none.
func podEntries(q *safedir.Dir, uid string) ([]quarantined, error) {
	pod, err := q.OpenDir(uid)
	if errors.Is(err, safedir.ErrWrongType) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer func() { _ = pod.Close() }()
	names, err := pod.Names()
	if err != nil {
		return nil, err
	}
	out := make([]quarantined, 0, len(names))
	for _, n := range names {
		fi, err := pod.Lstat(n)
		if err != nil {
			return nil, err
		}
		e := quarantined{pod: uid, name: n, at: quarantineTime(n, fi.ModTime())}
		if e.bytes, err = treeBytes(pod, n, fi); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

// quarantineTime is when the target called name was quarantined, as quarantineName wrote it, or else
// modified.
func quarantineTime(name string, modified time.Time) time.Time {
	i := strings.LastIndexByte(name, '-')
	if t, err := time.Parse("20060102T150405.000000000Z", name[i+1:]); i >= 0 && err == nil {
		return t
	}
	return modified
}

// treeBytes is how many bytes the regular files of the entry name of dir, which fi describes, hold.
func treeBytes(dir *safedir.Dir, name string, fi fs.FileInfo) (int64, error) {
	if !fi.IsDir() {
		if fi.Mode().IsRegular() {
			return fi.Size(), nil
		}
		return 0, nil
	}
	sub, err := dir.OpenDir(name)
	if err != nil {
		return 0, err
	}
	defer func() { _ = sub.Close() }()
	names, err := sub.Names()
	if err != nil {
		return 0, err
	}
	var total int64
	for _, n := range names {
		fi, err := sub.Lstat(n)
		if err != nil {
			return 0, err
		}
		b, err := treeBytes(sub, n, fi)
		if err != nil {
			return 0, err
		}
		total += b
	}
	return total, nil
}
