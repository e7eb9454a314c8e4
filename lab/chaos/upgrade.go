package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lace-cni/lace/lab"
	"github.com/lace-cni/lace/lab/images"
)

// DefaultFrom is the earlier build the downgrade fault rolls the cluster
// back to and forward from: the parent of d8b3f02, which changed
// lace_fdb's layout (version 1 to 2). Going back, the older agents find
// the pinned map at a version they do not know; coming forward, the
// newer ones find the older layout. It also predates the agents' restart
// grace (1c3178f) and NetworkPolicy (issue 21), so the cluster runs
// agents that do not know objects and annotations the newer ones write.
const DefaultFrom = "c4d7041243134883a535eba7eef88cb08df3ec9d"

// release is another build of Lace: its chart and its image, loaded into
// every node.
type release struct {
	rev   string
	chart string
	tag   string
}

// buildRelease builds revision rev of the repository at repo: its
// binaries into an image tagged after it, loaded into every node of the
// lab, and its chart, in a directory under tmp.
func (h *harness) buildRelease(ctx context.Context, repo, rev, tmp string) (*release, error) {
	full, err := exec.CommandContext(ctx, "git", "-C", repo, "rev-parse", "--verify", rev+"^{commit}").Output()
	if err != nil {
		return nil, fmt.Errorf("revision %s of %s: %w", rev, repo, err)
	}
	rev = strings.TrimSpace(string(full))
	src := filepath.Join(tmp, "src-"+rev[:12])
	if err := os.MkdirAll(src, 0o755); err != nil {
		return nil, err
	}
	archive := exec.CommandContext(ctx, "sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", repo, rev, src)
	if out, err := archive.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("check out %s: %v: %s", rev, err, out)
	}
	r := &release{rev: rev, chart: filepath.Join(src, "deploy", "helm", "lace"), tag: "chaos-" + rev[:12]}
	tarball := filepath.Join(tmp, r.tag+".tar")
	if err := images.BuildLace(ctx, src, nil, tarball, images.LaceRef(r.tag)); err != nil {
		return nil, err
	}
	if err := lab.Load(ctx, h.cfg, tarball, ""); err != nil {
		return nil, err
	}
	return r, nil
}

// downgrade rolls Lace back to the earlier release (its chart and its
// image) while the workload runs, checks the networks' reachability under
// it, then upgrades to this build again. Each roll replaces every agent
// and controller as an operator's helm upgrade does; held streams must
// live through both. The earlier agents know no restart grace, so the
// VIP may move while they roll: its streams are excused.
func downgrade(ctx context.Context, h *harness, w *workload) error {
	old := h.old
	if old == nil {
		return errors.New("no earlier release was built (lace-chaos --from)")
	}
	w.failover = "agents of " + old.rev[:12] + ", which know no restart grace"
	// Whatever fails under the earlier build, the run goes on (and is
	// reported) on this one.
	forward := func() error {
		if err := h.roll(context.WithoutCancel(ctx), "", h.cfg.LaceTag); err != nil {
			return fmt.Errorf("upgrade to this build: %w", err)
		}
		h.printf("  rolled forward to this build")
		return nil
	}
	if err := h.roll(ctx, old.chart, old.tag); err != nil {
		return errors.Join(fmt.Errorf("downgrade to %s: %w", old.rev[:12], err), forward())
	}
	h.printf("  rolled back to %s", old.rev[:12])
	if err := h.converge(ctx); err != nil {
		return errors.Join(err, forward())
	}
	layouts, err := h.layoutLogs(ctx)
	if err != nil {
		return errors.Join(err, forward())
	}
	h.printf("  %s's agents: %s", old.rev[:12], layouts)
	if err := errors.Join(checkAddresses(ctx, h), w.checkMatrix(ctx)); err != nil {
		return errors.Join(fmt.Errorf("under %s: %w", old.rev[:12], err), forward())
	}
	if err := forward(); err != nil {
		return err
	}
	if err := h.converge(ctx); err != nil {
		return err
	}
	layouts, err = h.layoutLogs(ctx)
	if err != nil {
		return err
	}
	h.printf("  this build's agents: %s", layouts)
	return nil
}

// roll installs chart (this build's when empty) with image tag and waits
// until every agent and controller runs it.
func (h *harness) roll(ctx context.Context, chart, tag string) error {
	install := func() error { return lab.HelmInstall(ctx, h.cfg, "image.tag="+tag) }
	if chart != "" {
		install = func() error { return lab.HelmInstallChart(ctx, h.cfg, chart, "image.tag="+tag) }
	}
	if err := install(); err != nil {
		return err
	}
	want := images.LaceRef(tag)
	return until(ctx, 5*time.Minute, "every Lace pod running "+want, func() error {
		var ds appsv1.DaemonSet
		if err := h.c.Get(ctx, crclient.ObjectKey{Namespace: lab.ReleaseNamespace, Name: lab.AgentDaemonSet}, &ds); err != nil {
			return err
		}
		if ds.Status.ObservedGeneration < ds.Generation || ds.Status.UpdatedNumberScheduled != ds.Status.DesiredNumberScheduled ||
			ds.Status.NumberReady != ds.Status.DesiredNumberScheduled || ds.Status.NumberUnavailable > 0 {
			return fmt.Errorf("agent DaemonSet: %d of %d updated, %d ready", ds.Status.UpdatedNumberScheduled, ds.Status.DesiredNumberScheduled, ds.Status.NumberReady)
		}
		var dep appsv1.Deployment
		if err := h.c.Get(ctx, crclient.ObjectKey{Namespace: lab.ReleaseNamespace, Name: lab.ControllerDeployment}, &dep); err != nil {
			return err
		}
		if dep.Status.ObservedGeneration < dep.Generation || dep.Status.UpdatedReplicas != dep.Status.Replicas || dep.Status.ReadyReplicas != dep.Status.Replicas {
			return fmt.Errorf("controller: %d of %d updated, %d ready", dep.Status.UpdatedReplicas, dep.Status.Replicas, dep.Status.ReadyReplicas)
		}
		for _, sel := range []string{agentSelector, controllerSelector} {
			pods, err := h.cs.CoreV1().Pods(lab.ReleaseNamespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
			if err != nil {
				return err
			}
			for _, p := range pods.Items {
				if img := mainImage(&p); img != want || !podReady(&p) {
					return fmt.Errorf("%s runs %s (ready %v)", p.Name, img, podReady(&p))
				}
			}
		}
		return nil
	})
}

func mainImage(p *corev1.Pod) string {
	if len(p.Spec.Containers) == 0 {
		return ""
	}
	return p.Spec.Containers[0].Image
}

// layoutLogs reports what each running agent logged about pinned maps
// of another layout: the proof that a roll crossed a layout change.
func (h *harness) layoutLogs(ctx context.Context) (string, error) {
	pods, err := h.cs.CoreV1().Pods(lab.ReleaseNamespace).List(ctx, metav1.ListOptions{LabelSelector: agentSelector})
	if err != nil {
		return "", err
	}
	var out []string
	for _, p := range pods.Items {
		b, err := h.cs.CoreV1().Pods(lab.ReleaseNamespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: "agent"}).DoRaw(ctx)
		if err != nil {
			return "", fmt.Errorf("logs of %s: %w", p.Name, err)
		}
		var maps []string
		for _, l := range strings.Split(string(b), "\n") {
			if !strings.Contains(l, "pinned map") {
				continue
			}
			if _, rest, ok := strings.Cut(l, `"map":"`); ok {
				name, _, _ := strings.Cut(rest, `"`)
				verb := "migrated"
				if strings.Contains(l, "recreating") {
					verb = "recreated"
				}
				maps = append(maps, verb+" "+name)
			}
		}
		if len(maps) == 0 {
			maps = []string{"no layout change"}
		}
		out = append(out, p.Spec.NodeName+": "+strings.Join(maps, ", "))
	}
	return strings.Join(out, "; "), nil
}
