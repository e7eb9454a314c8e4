package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Images the lab can run. It has no container runtime: agnhost images run
// the agnhost binary built by the tools module, the pause image runs
// `agnhost pause`, and every other image waits with ErrImagePull.
const (
	agnhostImage = "registry.k8s.io/e2e-test-images/agnhost"
	pauseImage   = "registry.k8s.io/pause"
	imageMessage = "the lab runs only registry.k8s.io/e2e-test-images/agnhost and registry.k8s.io/pause images"
)

func imageRepo(image string) string {
	repo := image
	if i := strings.LastIndex(repo, "@"); i >= 0 {
		repo = repo[:i]
	}
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i]
	}
	return repo
}

// argv resolves what a container runs, with the image's entrypoint
// (/agnhost, default command pause) applied as a runtime would.
func argv(c *corev1.Container, agnhost string) ([]string, error) {
	switch imageRepo(c.Image) {
	case pauseImage:
		return []string{agnhost, "pause"}, nil
	case agnhostImage:
	default:
		return nil, fmt.Errorf("cannot run image %q: %s", c.Image, imageMessage)
	}
	cmd, args := c.Command, c.Args
	if len(cmd) == 0 {
		cmd = []string{"/agnhost"}
		if len(args) == 0 {
			args = []string{"pause"}
		}
	}
	out := append(append([]string{}, cmd...), args...)
	if out[0] == "/agnhost" || out[0] == "agnhost" {
		out[0] = agnhost
	}
	return out, nil
}

// container is the lab's record of one container of a pod: its process,
// restarts and probe results. Fields are guarded by mu.
type container struct {
	spec    corev1.Container
	image   string
	logPath string

	mu           sync.Mutex
	cmd          *exec.Cmd
	started      bool
	startedAt    time.Time
	restartCount int32
	ready        bool
	waiting      *corev1.ContainerStateWaiting
	terminated   *corev1.ContainerStateTerminated
	lastTerm     *corev1.ContainerStateTerminated
	done         bool // terminated for good (no restart)
	id           string
}

func (c *container) status(podUID string) corev1.ContainerStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := corev1.ContainerStatus{
		Name:         c.spec.Name,
		Image:        c.image,
		ImageID:      "lab://" + imageRepo(c.image),
		RestartCount: c.restartCount,
		Ready:        c.ready && c.cmd != nil,
	}
	if c.id != "" {
		st.ContainerID = "lab://" + c.id
	}
	started := c.cmd != nil
	st.Started = &started
	switch {
	case c.cmd != nil:
		st.State.Running = &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(c.startedAt)}
	case c.terminated != nil && (c.done || c.waiting == nil):
		st.State.Terminated = c.terminated.DeepCopy()
	case c.waiting != nil:
		st.State.Waiting = c.waiting.DeepCopy()
	default:
		st.State.Waiting = &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}
	}
	if c.lastTerm != nil {
		st.LastTerminationState.Terminated = c.lastTerm.DeepCopy()
	}
	return st
}

func (c *container) setWaiting(reason, msg string) {
	c.mu.Lock()
	c.waiting = &corev1.ContainerStateWaiting{Reason: reason, Message: msg}
	c.mu.Unlock()
}

// processEnv is the environment of a container process: the lab's binaries
// first on PATH, then the container's own variables.
func processEnv(k *kubelet, p *corev1.Pod, c *corev1.Container) []string {
	env := []string{
		"PATH=" + k.binDir() + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		EnvLab + "=" + k.cfg.Name,
		"HOSTNAME=" + p.Name,
		"HOME=/root",
	}
	for _, e := range c.Env {
		v := e.Value
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			switch e.ValueFrom.FieldRef.FieldPath {
			case "metadata.name":
				v = p.Name
			case "metadata.namespace":
				v = p.Namespace
			case "metadata.uid":
				v = string(p.UID)
			case "spec.nodeName":
				v = p.Spec.NodeName
			case "status.podIP":
				v = p.Status.PodIP
			case "status.hostIP":
				v = p.Status.HostIP
			}
		}
		env = append(env, e.Name+"="+v)
	}
	return env
}

// startProcess starts argv (already wrapped to enter the pod's namespaces)
// with output appended to logPath. The process gets its own process group
// so that a stop reaches its children too, and dies with the lab.
func startProcess(argv, env []string, dir, logPath string) (*exec.Cmd, error) {
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open container log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env, cmd.Stdout, cmd.Stderr, cmd.Dir = env, logf, logf, dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", argv[0], err)
	}
	return cmd, nil
}

// stopProcess sends SIGTERM to the process group, then SIGKILL after grace.
func stopProcess(cmd *exec.Cmd, exited <-chan struct{}, grace time.Duration) {
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(grace):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	}
}

func exitInfo(err error) (code int32, signal int32) {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int32(ws.Signal()), int32(ws.Signal())
		}
		return int32(ee.ExitCode()), 0
	}
	if err != nil {
		return 128, 0
	}
	return 0, 0
}

// supervise runs the container until ctx ends, restarting it as the pod's
// restartPolicy says, with exponential back-off as kubelet does.
func (p *pod) supervise(ctx context.Context, c *container) {
	backoff := time.Second
	for {
		if ctx.Err() != nil {
			return
		}
		args, err := argv(&c.spec, p.k.agnhost())
		if err != nil {
			c.setWaiting("ErrImagePull", err.Error())
			p.changed()
			return
		}
		env := processEnv(p.k, p.snapshot(), &c.spec)
		cmd, err := startProcess(p.enter(args), env, p.dir, c.logPath)
		if err != nil {
			c.setWaiting("RunContainerError", err.Error())
			p.changed()
			if !sleepCtx(ctx, backoff) {
				return
			}
			backoff = min(backoff*2, 30*time.Second)
			continue
		}
		exited := make(chan struct{})
		var waitErr error
		go func() { waitErr = cmd.Wait(); close(exited) }()

		c.mu.Lock()
		c.cmd, c.started, c.startedAt, c.waiting, c.ready = cmd, true, time.Now(), nil, false
		c.id = fmt.Sprintf("%s-%s-%d", p.uid, c.spec.Name, c.restartCount)
		c.mu.Unlock()
		p.changed()
		runStart := time.Now()

		select {
		case <-exited:
		case <-ctx.Done():
			stopProcess(cmd, exited, p.grace())
		}
		code, sig := exitInfo(waitErr)
		term := &corev1.ContainerStateTerminated{
			ExitCode: code, Signal: sig, Reason: "Completed",
			StartedAt: metav1.NewTime(runStart), FinishedAt: metav1.Now(), ContainerID: "lab://" + c.id,
		}
		if code != 0 {
			term.Reason = "Error"
		}
		restart := false
		switch p.restartPolicy() {
		case corev1.RestartPolicyAlways:
			restart = true
		case corev1.RestartPolicyOnFailure:
			restart = code != 0
		}
		if ctx.Err() != nil {
			restart = false
		}
		c.mu.Lock()
		c.cmd, c.ready, c.terminated = nil, false, term
		if restart {
			c.lastTerm, c.terminated = term, nil
			c.restartCount++
			c.waiting = &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff",
				Message: fmt.Sprintf("back-off %s restarting failed container %s", backoff, c.spec.Name)}
		} else {
			c.done = true
		}
		c.mu.Unlock()
		p.changed()
		if !restart {
			return
		}
		// A container that ran for a while starts its back-off afresh.
		if time.Since(runStart) > time.Minute {
			backoff = time.Second
		}
		if !sleepCtx(ctx, backoff) {
			return
		}
		backoff = min(backoff*2, 30*time.Second)
	}
}

// kill stops the container's current process (a failed liveness probe);
// supervise then restarts it as the restart policy says.
func (c *container) kill() {
	c.mu.Lock()
	cmd := c.cmd
	c.mu.Unlock()
	if cmd != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
