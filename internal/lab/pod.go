package lab

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lace-cni/lace/internal/netutil"
)

// pod is the lab kubelet's runtime state of one pod incarnation (one UID).
type pod struct {
	k   *kubelet
	uid string
	ns  string
	nm  string
	dir string

	// netns is the namespace the containers run in: the pod's own, or the
	// node's for hostNetwork pods.
	netns   string
	ownNS   bool
	sandbox bool // CNI ADD succeeded; DEL is owed
	// holder keeps the pod's UTS namespace (hostname = pod name), as a
	// pause container does; containers join it and the network namespace.
	holder     *exec.Cmd
	holderDone chan struct{}

	mu         sync.Mutex
	spec       *corev1.Pod
	ips        []netip.Addr
	setupErr   string
	startTime  time.Time
	containers []*container
	cancel     context.CancelFunc
	wg         sync.WaitGroup
}

func (p *pod) key() string { return p.ns + "/" + p.nm }

func (p *pod) snapshot() *corev1.Pod {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.spec.DeepCopy()
}

func (p *pod) update(spec *corev1.Pod) {
	p.mu.Lock()
	p.spec = spec.DeepCopy()
	p.mu.Unlock()
}

func (p *pod) restartPolicy() corev1.RestartPolicy {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.spec.Spec.RestartPolicy
}

// grace is how long containers get between SIGTERM and SIGKILL.
func (p *pod) grace() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if g := p.spec.DeletionGracePeriodSeconds; g != nil {
		return time.Duration(*g) * time.Second
	}
	if g := p.spec.Spec.TerminationGracePeriodSeconds; g != nil {
		return time.Duration(*g) * time.Second
	}
	return 30 * time.Second
}

func (p *pod) changed() { p.k.statusChanged(p) }

// start creates the pod's network (namespace + CNI ADD) and starts its
// containers. A network failure is recorded for the status and retried by
// the next sync.
func (p *pod) start(ctx context.Context) error {
	spec := p.snapshot()
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		return fmt.Errorf("create pod dir: %w", err)
	}
	if spec.Spec.HostNetwork {
		p.netns, p.ownNS = p.k.nodeNS, false
		v4, v6 := NodeUnderlay(p.k.index)
		p.mu.Lock()
		p.ips = []netip.Addr{v4, v6}
		p.mu.Unlock()
	} else if !p.sandbox {
		p.netns, p.ownNS = p.k.cfg.PodNetNS(p.uid), true
		if err := netutil.CreateNamed(p.netns); err != nil {
			return p.failSetup(fmt.Errorf("create pod network namespace: %w", err))
		}
		addCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		ips, err := p.k.cni.Add(addCtx, PodRuntimeConf(p.uid, netutil.Path(p.netns), p.ns, p.nm, p.uid))
		cancel()
		if err != nil {
			// Leave nothing half-made behind: DEL is safe after a failed ADD.
			_ = p.k.cni.Del(ctx, PodRuntimeConf(p.uid, netutil.Path(p.netns), p.ns, p.nm, p.uid))
			return p.failSetup(fmt.Errorf("CNI ADD: %w", err))
		}
		p.sandbox = true
		p.mu.Lock()
		p.ips, p.setupErr = ips, ""
		p.mu.Unlock()
		p.k.log.Info("pod network ready", "pod", p.key(), "ips", ips)
	}

	if err := p.startHolder(spec); err != nil {
		return p.failSetup(err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	p.mu.Lock()
	p.cancel = cancel
	p.startTime = time.Now()
	p.containers = nil
	for _, c := range spec.Spec.Containers {
		p.containers = append(p.containers, &container{
			spec: c, image: c.Image, logPath: filepath.Join(p.dir, c.Name+".log"),
		})
	}
	cs := p.containers
	p.mu.Unlock()
	for _, c := range cs {
		p.wg.Add(2)
		go func() { defer p.wg.Done(); p.supervise(runCtx, c) }()
		go func() { defer p.wg.Done(); p.probe(runCtx, c) }()
	}
	p.changed()
	return nil
}

func (p *pod) failSetup(err error) error {
	p.mu.Lock()
	p.setupErr = err.Error()
	p.mu.Unlock()
	p.changed()
	return err
}

func (p *pod) started() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cancel != nil
}

// stop ends the containers (SIGTERM, then SIGKILL after the grace period),
// runs CNI DEL and removes the pod's namespace and files. Stopping a pod
// that never started, or twice, is fine.
func (p *pod) stop(ctx context.Context) error {
	p.mu.Lock()
	cancel := p.cancel
	p.mu.Unlock()
	if cancel != nil {
		cancel()
		p.wg.Wait()
	}
	if p.holder != nil {
		stopProcess(p.holder, p.holderDone, time.Second)
		p.holder = nil
	}
	var errs []error
	if p.ownNS {
		if p.sandbox || netutil.Exists(p.netns) {
			if err := p.k.cni.Del(ctx, PodRuntimeConf(p.uid, netutil.Path(p.netns), p.ns, p.nm, p.uid)); err != nil {
				errs = append(errs, fmt.Errorf("CNI DEL: %w", err))
			} else {
				p.sandbox = false
			}
		}
		if err := netutil.DeleteNamed(p.netns); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(p.dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// status computes the pod status the kubelet reports.
func (p *pod) status(prev corev1.PodStatus) corev1.PodStatus {
	p.mu.Lock()
	spec := p.spec
	ips, setupErr, startTime, cs := p.ips, p.setupErr, p.startTime, p.containers
	p.mu.Unlock()

	st := corev1.PodStatus{QOSClass: prev.QOSClass}
	if st.QOSClass == "" {
		st.QOSClass = corev1.PodQOSBestEffort
	}
	v4, v6 := NodeUnderlay(p.k.index)
	st.HostIP = v4.String()
	st.HostIPs = []corev1.HostIP{{IP: v4.String()}, {IP: v6.String()}}
	for _, ip := range ips {
		st.PodIPs = append(st.PodIPs, corev1.PodIP{IP: ip.String()})
	}
	if len(ips) > 0 {
		st.PodIP = ips[0].String()
	}
	if !startTime.IsZero() {
		t := metav1.NewTime(startTime)
		st.StartTime = &t
	}

	running, done, failed, ready, allStarted := 0, 0, 0, 0, true
	names := map[string]bool{}
	for _, c := range cs {
		s := c.status(p.uid)
		names[s.Name] = true
		st.ContainerStatuses = append(st.ContainerStatuses, s)
		switch {
		case s.State.Running != nil:
			running++
			if s.Ready {
				ready++
			}
		case s.State.Terminated != nil:
			done++
			if s.State.Terminated.ExitCode != 0 {
				failed++
			}
		}
		if s.State.Running == nil && s.RestartCount == 0 && s.State.Terminated == nil {
			allStarted = false
		}
	}
	// Containers not started yet (network still being set up).
	for _, c := range spec.Spec.Containers {
		if !names[c.Name] {
			reason, msg := "ContainerCreating", ""
			if setupErr != "" {
				msg = setupErr
			}
			st.ContainerStatuses = append(st.ContainerStatuses, corev1.ContainerStatus{
				Name: c.Name, Image: c.Image, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}},
			})
			allStarted = false
		}
	}
	n := len(spec.Spec.Containers)
	switch {
	case done == n && n > 0 && failed == 0:
		st.Phase = corev1.PodSucceeded
	case done == n && n > 0:
		st.Phase = corev1.PodFailed
	case running > 0 || (allStarted && len(cs) == n):
		st.Phase = corev1.PodRunning
	default:
		st.Phase = corev1.PodPending
	}

	cond := func(t corev1.PodConditionType, ok bool, reason, msg string) corev1.PodCondition {
		s := corev1.ConditionFalse
		if ok {
			s, reason, msg = corev1.ConditionTrue, "", ""
		}
		c := corev1.PodCondition{Type: t, Status: s, Reason: reason, Message: msg, LastTransitionTime: metav1.Now()}
		for _, old := range prev.Conditions {
			if old.Type == t && old.Status == s {
				c.LastTransitionTime = old.LastTransitionTime
			}
		}
		return c
	}
	netReady := len(ips) > 0
	allReady := ready == n && n > 0
	st.Conditions = []corev1.PodCondition{
		cond(corev1.PodReadyToStartContainers, netReady, "", setupErr),
		cond(corev1.PodInitialized, true, "", ""),
		cond(corev1.ContainersReady, allReady, "ContainersNotReady", "containers not ready"),
		cond(corev1.PodReady, allReady, "ContainersNotReady", "containers not ready"),
	}
	for _, old := range prev.Conditions {
		if old.Type == corev1.PodScheduled {
			st.Conditions = append(st.Conditions, old)
		}
	}
	return st
}

// containerByName returns the named container, or nil.
func (p *pod) containerByName(name string) *container {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.containers {
		if c.spec.Name == name {
			return c
		}
	}
	return nil
}

// podIP returns the pod's first address (invalid before the network is up).
func (p *pod) podIP() netip.Addr {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.ips) == 0 {
		return netip.Addr{}
	}
	return p.ips[0]
}

// startHolder starts the process that owns the pod's UTS namespace.
func (p *pod) startHolder(spec *corev1.Pod) error {
	if p.holder != nil {
		return nil
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	hostname := spec.Name
	if spec.Spec.HostNetwork {
		hostname = p.k.node
	}
	cmd := exec.Command(self, "sandbox", "--hostname", hostname)
	cmd.Env = []string{EnvLab + "=" + p.k.cfg.Name}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUTS, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start pod sandbox: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	p.holder, p.holderDone = cmd, done
	return nil
}

// enter wraps argv so that it runs in the pod's network and UTS namespaces.
func (p *pod) enter(argv []string) []string {
	out := []string{"nsenter", "--net=" + netutil.Path(p.netns)}
	if p.holder != nil {
		out = append(out, fmt.Sprintf("--uts=/proc/%d/ns/uts", p.holder.Process.Pid))
	}
	return append(append(out, "--"), argv...)
}

// RunSandbox is the body of a pod's namespace holder: it names the UTS
// namespace it was started in and waits to be stopped.
func RunSandbox(hostname string) error {
	if err := syscall.Sethostname([]byte(hostname)); err != nil {
		return fmt.Errorf("set hostname: %w", err)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	return nil
}
