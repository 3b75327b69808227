package csiproxy

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/internal/recordfile"
	"crust.dev/crust/internal/testutil/harness"
	"crust.dev/crust/internal/testutil/sandbox"
)

// The calls a kill may interrupt, and the sandbox's steps between them.
const (
	opPublish   = "publish"
	opUnpublish = "unpublish"
	opStats     = "stats"
	opExpand    = "expand"
	opClaim     = "claim"   // the microVM sandbox claims and mounts the deferred volume (not through the proxy)
	opRelease   = "release" // and lets it go before kubelet unpublishes
)

// killCycles is how many pods, one after the other, use each slot's volume before the names come round again.
const killCycles = 100

// killPod is the pod of a slot's cycle: a new pod (name, UID, so target path) each time.
func killPod(slot, cycle int, microVM bool) Pod {
	p := Pod{Namespace: "ns", Name: fmt.Sprintf("kill-%d-%d", slot, cycle%killCycles),
		UID: fmt.Sprintf("0e0e0e0e-0000-4000-8%03d-%012d", slot, cycle%killCycles)}
	if microVM {
		p.RuntimeClassName = "kata"
	}
	return p
}

// killSlot is one volume, published to pod after pod and unpublished again by its caller, as kubelet does.
type killSlot struct {
	i, cycle                int
	mode                    Mode
	vol                     *csi.Volume
	pod                     Pod
	kubelet, pv             string
	staging, target         string
	sb                      *sandbox.Sandbox // deferred slots: the pod's sandbox
	published               bool             // the last publish was acknowledged and no unpublish since
	plan                    []string         // what the caller does next, first the call in flight
	inFlight                string           // the proxy call that a kill interrupted, "" for none
	givingUp                bool             // the planned unpublish undoes an interrupted publish
	gen                     int              // the pod's last write to the volume (see write)
	size                    int64            // the volume's size
	acks                    map[string]int   // acknowledged calls by operation
	interrupted, gaveUp     int              // calls a kill interrupted; interrupted publishes given up (unpublished instead)
	retriedAlive, whole     int              // calls retried while the proxy lived; interrupted calls found whole after the kill
	completedOnRetry, undid int              // interrupted calls completed by the retry; interrupted publishes undone by an unpublish
	onAck                   func(op string)  // told of each acknowledged call (killRound's progress)
}

func (s *killSlot) pub() *csi.NodePublishVolumeRequest {
	return &csi.NodePublishVolumeRequest{VolumeId: s.vol.GetVolumeId(), StagingTargetPath: s.staging, TargetPath: s.target,
		VolumeCapability: mountCap(), VolumeContext: podContext(s.vol, s.pod.Namespace, s.pod.Name, s.pod.UID)}
}

// newPod makes the slot's volume the next pod's, with its volume directory made as kubelet makes it.
func (s *killSlot) newPod() error {
	s.cycle++
	s.pod = killPod(s.i, s.cycle, s.mode == ModeDeferred)
	dir := filepath.Join(s.kubelet, "pods", s.pod.UID, "volumes", "kubernetes.io~csi", s.pv)
	s.target = filepath.Join(dir, "mount")
	return os.MkdirAll(dir, 0o750)
}

// podGone is kubelet's clean-up once the volume is unpublished: it removes the volume's directory and
// the pod's, which fails when anything is left in them.
func (s *killSlot) podGone() error {
	dir := filepath.Dir(s.target)
	for range 4 { // <pv>, kubernetes.io~csi, volumes, <uid>
		if err := os.Remove(dir); err != nil {
			return fmt.Errorf("kubelet's clean-up after an acknowledged unpublish: %w", err)
		}
		dir = filepath.Dir(dir)
	}
	return nil
}

// next plans a pod's cycle when nothing is planned: publish, the sandbox's claim (deferred), a few stats
// and expansions in random order, the release, unpublish.
func (s *killSlot) next() string {
	if len(s.plan) == 0 {
		s.plan = []string{opPublish}
		if s.mode == ModeDeferred {
			s.plan = append(s.plan, opClaim)
		}
		for range 1 + rand.IntN(4) {
			s.plan = append(s.plan, []string{opStats, opExpand}[rand.IntN(2)])
		}
		if s.mode == ModeDeferred {
			s.plan = append(s.plan, opRelease)
		}
		s.plan = append(s.plan, opUnpublish)
	}
	return s.plan[0]
}

// do makes one call of the plan.
func (s *killSlot) do(ctx context.Context, n csi.NodeClient, op string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var err error
	switch op {
	case opPublish:
		if _, err = n.NodePublishVolume(ctx, s.pub()); err == nil && s.mode == ModeHost {
			err = s.write(s.target)
		}
	case opUnpublish:
		_, err = n.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: s.vol.GetVolumeId(), TargetPath: s.target})
	case opStats:
		var r *csi.NodeGetVolumeStatsResponse
		r, err = n.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: s.vol.GetVolumeId(), VolumePath: s.target,
			StagingTargetPath: s.staging})
		// The filesystem fills the volume, less its own metadata.
		if err == nil {
			if u := r.GetUsage(); len(u) == 0 || u[0].GetTotal() < s.size*7/10 || u[0].GetTotal() > s.size {
				err = fmt.Errorf("stats %v: want a filesystem of the volume's %d bytes, less metadata", u, s.size)
			}
		}
	case opExpand:
		// The same size again. Growing the volume under kills is not done here: the reference driver's
		// extent-map fallback (this kernel has no device-mapper) stops answering then.
		_, err = n.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: s.vol.GetVolumeId(), VolumePath: s.target,
			StagingTargetPath: s.staging, VolumeCapability: mountCap(),
			CapacityRange: &csi.CapacityRange{RequiredBytes: s.size}})
	case opClaim:
		var guest string
		if guest, err = s.sb.Claim(s.target); err == nil {
			err = s.write(guest)
		}
	case opRelease:
		s.sb.Stop(s.target)
	}
	return err
}

// markerFile is where a pod writes the number of times it has had its volume.
const markerFile = "generation"

// write is the pod using its volume, mounted at dir: it finds what it wrote last time and writes the next
// generation, so a volume that lost data or was formatted again is seen.
//
// A pod's files belong to another process. Here the test process opens them, while its other goroutines
// start children (the sandboxes' mount, umount and fsck): a child forked while one is open holds it
// until the child's exec, so an unmount just after the file is closed could find the mount busy. So the
// file stays open only under syscall.ForkLock held for reading, which every fork waits for.
func (s *killSlot) write(dir string) error {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	if err := s.holds(dir); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, markerFile))
	if err != nil {
		return err
	}
	_, err = fmt.Fprint(f, s.gen+1)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		s.gen++
	}
	return err
}

// holds checks that the volume mounted at dir holds the pod's last write. While other goroutines may
// fork, its caller holds syscall.ForkLock for reading (see write).
func (s *killSlot) holds(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, markerFile))
	if s.gen == 0 && errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil || string(b) != strconv.Itoa(s.gen) {
		return fmt.Errorf("%s holds generation %q (%v), want %d", dir, b, err, s.gen)
	}
	return nil
}

// retryable is what kubelet retries as it came: the proxy gone, or a call of its still running.
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.Aborted, codes.DeadlineExceeded, codes.Canceled:
		return true
	}
	return false
}

// retryFor calls f until it succeeds, fails for a reason kubelet does not retry, or d passes: after the
// last kill, the driver may still be running what the killed proxy asked (ABORTED for the same volume).
func retryFor(d time.Duration, f func() error) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var err error
	_ = harness.Poll(ctx, func() (bool, error) {
		err = f()
		return err == nil || !retryable(err), nil
	})
	return err
}

// work runs the slot's plan against the proxy until the proxy is killed (dead closed and a call failed
// as kubelet retries) or a call fails for another reason (returned).
func (s *killSlot) work(ctx context.Context, e *env, n csi.NodeClient, dead <-chan struct{}) error {
	for {
		if len(s.plan) == 0 && s.target == "" {
			if err := s.newPod(); err != nil {
				return err
			}
		}
		op := s.next()
		err := s.do(ctx, n, op)
		if err != nil && retryable(err) {
			select {
			case <-dead:
				if op != opClaim && op != opRelease {
					s.inFlight = op
					s.interrupted++
				}
				return nil
			default:
			}
			s.retriedAlive++
			if s.retriedAlive > 1000 {
				return fmt.Errorf("%s %s: retried more than 1000 times while the proxy lived: %w", op, s.target, err)
			}
			time.Sleep(10 * time.Millisecond) // kubelet's retry back-off, shortened: the caller under test
			continue
		}
		if err != nil {
			return fmt.Errorf("%s %s: %w", op, s.target, err)
		}
		if s.inFlight != "" {
			s.completedOnRetry++
			s.inFlight = ""
		}
		if op == opUnpublish && s.givingUp {
			s.undid++
			s.givingUp = false
		}
		s.acks[op]++
		if s.onAck != nil {
			s.onAck(op)
		}
		s.plan = s.plan[1:]
		switch op {
		case opPublish:
			s.published = true
			if err := e.published(s.mode, s.target); err != nil {
				return fmt.Errorf("right after an acknowledged publish: %w", err)
			}
		case opUnpublish:
			s.published = false
			if err := e.unpublished(s.target); err != nil {
				return fmt.Errorf("right after an acknowledged unpublish: %w", err)
			}
			if err := s.podGone(); err != nil {
				return err
			}
			s.target = ""
		}
	}
}

// TestKillUnderLoad kills the proxy (SIGKILL) at random instants while six pods' callers publish,
// unpublish, ask stats of and expand their volumes at once, three deferred to a microVM sandbox and three
// mounted on the host, with the reference driver and crustd; a few kills land while it starts. After each
// kill, with the proxy dead, it checks that nothing acknowledged is lost (each acknowledged publish is
// whole: descriptor or host mount, private bind mount, record), that nothing is left of an acknowledged
// unpublish (descriptor, mount, private path, target, record), and that every record in the state
// directory belongs to a staged volume or a live or interrupted publish. Then it restarts the proxy and
// the callers retry what was interrupted, as kubelet does (an interrupted publish is sometimes given up
// and unpublished instead). At the end everything is unpublished and unstaged, and nothing is left.
func TestKillUnderLoad(t *testing.T) {
	kills := 120
	if testing.Short() {
		kills = 30
	}
	e := newEnv(t)
	pods := map[string]Pod{}
	var slots []*killSlot
	for i := range 6 {
		mode := ModeDeferred
		if i%2 == 1 {
			mode = ModeHost
		}
		for c := range killCycles {
			p := killPod(i, c, mode == ModeDeferred)
			pods[p.Namespace+"/"+p.Name] = p
		}
		pv := fmt.Sprintf("pv-kill-%d", i)
		s := &killSlot{i: i, cycle: -1, mode: mode, vol: e.createVolume(fmt.Sprintf("pvc-kill-%d", i), 32<<20, true),
			kubelet: e.kubelet, pv: pv, staging: e.staging(pv), acks: map[string]int{}, size: 32 << 20}
		if mode == ModeDeferred {
			s.sb = sandbox.New(t, e.crustSock, fmt.Sprintf("sandbox-%d", i))
		}
		slots = append(slots, s)
	}
	t.Cleanup(func() { // after a failure, whatever is left would keep the driver from stopping
		if t.Failed() {
			m := mountsUnder(e.kubelet)
			for i := len(m) - 1; i >= 0; i-- {
				_ = syscall.Unmount(m[i], syscall.MNT_DETACH)
			}
		}
	})
	bootID, err := recordfile.ReadBootID()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	p := e.startChild(crashPoint{}, pods)
	for _, s := range slots {
		if _, err := p.node().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: s.vol.GetVolumeId(),
			StagingTargetPath: s.staging, VolumeCapability: mountCap(), VolumeContext: s.vol.GetVolumeContext()}); err != nil {
			t.Fatalf("stage: %v", err)
		}
	}
	p.stop()

	var startKills, tmpLeft int
	t0 := time.Now()
	k := 0
	for ; k < kills; k++ {
		if rand.IntN(10) == 0 { // a kill while the proxy starts: opening its state, connecting
			c := e.spawnChild(crashPoint{}, pods)
			// The kill's instant is what is under test: any moment of the start, whatever the start has
			// reached by then.
			time.Sleep(rand.N(60 * time.Millisecond))
			_ = c.cmd.Process.Kill()
			_ = c.cmd.Wait()
			startKills++
		} else {
			e.killRound(slots, pods, k%2 == 0)
		}
		e.checkAfterKill(k, slots, bootID)
		if names, _ := os.ReadDir(filepath.Join(e.state, "tmp")); len(names) > 0 {
			tmpLeft++ // emptied when the proxy starts; assertClean checks it at the end
		}
		if t.Failed() {
			break // and undo everything, or the driver cannot stop
		}
	}
	elapsed := time.Since(t0)

	// The last proxy: the callers finish what was interrupted, unpublish, and everything is unstaged.
	p = e.startChild(crashPoint{}, pods)
	defer p.stop()
	for _, s := range slots {
		s.plan = nil
		if s.target != "" {
			s.plan = []string{opUnpublish}
			if s.mode == ModeDeferred {
				s.plan = []string{opRelease, opUnpublish}
			}
		}
		for len(s.plan) > 0 {
			if err := retryFor(30*time.Second, func() error { return s.do(ctx, p.node(), s.plan[0]) }); err != nil {
				t.Errorf("final %s of %s: %v", s.plan[0], s.target, err)
			}
			s.plan = s.plan[1:]
		}
		if s.target != "" {
			if err := e.unpublished(s.target); err != nil {
				t.Error(err)
			} else if err := s.podGone(); err != nil {
				t.Error(err)
			}
		}
		if err := retryFor(30*time.Second, func() error {
			_, err := p.node().NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: s.vol.GetVolumeId(),
				StagingTargetPath: s.staging})
			return err
		}); err != nil {
			t.Errorf("unstage: %v", err)
		}
	}
	p.stop()
	e.assertClean()

	acks := map[string]int{}
	var interrupted, gaveUp, whole, completed, undid, retriedAlive int
	for _, s := range slots {
		for op, n := range s.acks {
			acks[op] += n
		}
		interrupted += s.interrupted
		gaveUp += s.gaveUp
		whole += s.whole
		completed += s.completedOnRetry
		undid += s.undid
		retriedAlive += s.retriedAlive
	}
	t.Logf("%d kills in %s (%d while starting), %d slots; acknowledged: %d publish, %d unpublish, %d stats, %d expand (%d claims); "+
		"%d calls interrupted: %d found whole after the kill, %d completed on retry, %d publishes given up and undone; %d retries while the proxy lived; "+
		"%d kills left a temporary file",
		k, elapsed.Round(100*time.Millisecond), startKills, len(slots), acks[opPublish], acks[opUnpublish], acks[opStats], acks[opExpand],
		acks[opClaim], interrupted, whole, completed, undid, retriedAlive, tmpLeft)
	if acks[opPublish] < k/4 || interrupted < k/4 {
		t.Errorf("%d publishes acknowledged and %d calls interrupted in %d kills: the load was too light to prove much", acks[opPublish], interrupted, k)
	}
}

// killRound starts the proxy, lets the callers retry what was interrupted and go on, and kills the proxy
// at a random instant; it returns once every caller has seen the proxy die. With needPublish the instant
// comes only after a publish was acknowledged in this round: progress, not a time that assumes a rate, so
// that a slow machine makes the rounds longer rather than the load lighter.
func (e *env) killRound(slots []*killSlot, pods map[string]Pod, needPublish bool) {
	e.t.Helper()
	c := e.startChild(crashPoint{}, pods)
	var published atomic.Bool
	progress := make(chan struct{}, 1)
	for _, s := range slots {
		if s.inFlight == opPublish && rand.IntN(4) == 0 { // kubelet gives up: the pod went away meanwhile
			s.plan, s.inFlight, s.givingUp = []string{opUnpublish}, "", true
			s.gaveUp++
		}
		s.onAck = func(op string) {
			if op == opPublish && published.CompareAndSwap(false, true) {
				close(progress)
			}
		}
	}
	dead := make(chan struct{})
	errs, failed := make(chan error, len(slots)), make(chan struct{}, len(slots))
	var wg sync.WaitGroup
	for _, s := range slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := s.work(context.Background(), e, c.node(), dead)
			if err != nil {
				failed <- struct{}{}
			}
			errs <- err
		}()
	}
	if needPublish {
		select {
		case <-progress:
		case <-failed: // reported below
		case <-time.After(2 * time.Minute):
			e.t.Error("no publish acknowledged in 2 minutes of the proxy's life")
		}
	}
	// The kill's instant is what is under test: mostly short lives; now and then a longer one, in which
	// the slowest calls finish too.
	life := rand.N(600 * time.Millisecond)
	if rand.IntN(10) == 0 {
		life = 600*time.Millisecond + rand.N(1500*time.Millisecond)
	}
	time.Sleep(life)
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		e.t.Fatal(err)
	}
	close(dead)
	wg.Wait()
	for _, s := range slots {
		s.onAck = nil
	}
	c.killed()
	close(errs)
	for err := range errs {
		if err != nil {
			e.t.Error(err)
		}
	}
}

// checkAfterKill checks, with the proxy dead, that each acknowledged publish is whole and each
// acknowledged unpublish left nothing, counts the interrupted calls found whole, and checks that every
// record in the state directory belongs to a staged volume or a live or interrupted publish.
func (e *env) checkAfterKill(k int, slots []*killSlot, bootID string) {
	e.t.Helper()
	allowed := map[string]bool{}
	live := map[string]bool{} // the pods' UIDs, and their current targets
	for _, s := range slots {
		allowed[string(KindStage)+":"+s.staging] = true
		if s.target == "" {
			continue
		}
		live[s.pod.UID], live[s.target] = true, true
		pubErr, goneErr := e.published(s.mode, s.target), e.unpublished(s.target)
		switch s.inFlight {
		case opPublish:
			if pubErr == nil {
				s.whole++
			}
			allowed[string(KindPublish)+":"+s.target] = true
			continue
		case opUnpublish:
			if goneErr == nil {
				s.whole++
			}
			allowed[string(KindPublish)+":"+s.target] = true
			continue
		}
		// Stats and expansion change nothing: the publish they ran on is checked as acknowledged.
		if s.published {
			allowed[string(KindPublish)+":"+s.target] = true
			if pubErr != nil {
				e.t.Errorf("kill %d: an acknowledged publish is not whole: %v", k, pubErr)
			} else if s.mode == ModeHost {
				if err := s.holds(s.target); err != nil {
					e.t.Errorf("kill %d: an acknowledged publish lost data: %v", k, err)
				}
			}
		} else if goneErr != nil {
			e.t.Errorf("kill %d: an acknowledged unpublish (or none yet) left something: %v", k, goneErr)
		}
	}
	// Nothing of an earlier pod: no pod directory, no mount, no descriptor.
	pods := filepath.Join(e.kubelet, "pods")
	uids, err := os.ReadDir(pods)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, u := range uids {
		if !live[u.Name()] {
			e.t.Errorf("kill %d: the directory of an earlier pod is left: %s", k, u.Name())
		}
	}
	for _, m := range mountsUnder(pods) {
		if uid, _, _ := strings.Cut(strings.TrimPrefix(m, pods+"/"), "/"); !live[uid] {
			e.t.Errorf("kill %d: a mount of an earlier pod is left: %s", k, m)
		}
	}
	l, err := e.crust.ListVolumes(context.Background(), &crustv1.ListVolumesRequest{})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, v := range l.GetVolumes() {
		if !live[v.GetSpec().GetVolumeTargetPath()] {
			e.t.Errorf("kill %d: a descriptor of an earlier pod is left: %s", k, v.GetSpec().GetVolumeTargetPath())
		}
	}
	names, err := os.ReadDir(filepath.Join(e.state, "records"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		e.t.Fatal(err)
	}
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(e.state, "records", n.Name()))
		if err != nil {
			e.t.Errorf("kill %d: record %s: %v", k, n.Name(), err)
			continue
		}
		r, err := decodeRecord(b, bootID)
		if err != nil {
			e.t.Errorf("kill %d: record %s: %v", k, n.Name(), err)
			continue
		}
		if !allowed[string(r.Kind)+":"+r.Path] {
			e.t.Errorf("kill %d: record of %s %s (%s) belongs to nothing live", k, r.Kind, r.Path, r.Phase)
		}
	}
	for _, d := range []string{"block", "corrupt"} {
		if names, _ := os.ReadDir(filepath.Join(e.state, d)); len(names) > 0 {
			e.t.Errorf("kill %d: %s/ holds %v", k, d, names)
		}
	}
}

// unpublished checks that nothing of a publish at target is left: no descriptor, no mount under its volume
// directory, no private path, no target path, no record.
func (e *env) unpublished(target string) error {
	var left []string
	if _, err := e.crust.GetVolume(context.Background(), &crustv1.GetVolumeRequest{VolumeTargetPath: target}); status.Code(err) != codes.NotFound {
		left = append(left, fmt.Sprintf("descriptor (%v)", err))
	}
	if m := mountsUnder(filepath.Dir(target)); len(m) > 0 {
		left = append(left, fmt.Sprintf("mounts %v", m))
	}
	for _, p := range []string{filepath.Join(filepath.Dir(target), privateBlockDir), target,
		filepath.Join(e.state, "records", recordKey(KindPublish, target)+".json")} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			left = append(left, p)
		}
	}
	if len(left) > 0 {
		sort.Strings(left)
		return fmt.Errorf("%s: left %s", target, strings.Join(left, ", "))
	}
	return nil
}
