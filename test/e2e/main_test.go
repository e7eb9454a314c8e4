// Package e2e holds the end-to-end tests: they bring up a real lab (a
// Kubernetes control plane, node namespaces, lab kubelets) with the
// lace-lab binary, drive it through the API server and real packets, and
// tear it down, checking that nothing is left behind.
package e2e

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/lace-cni/lace/internal/testutil"
	"github.com/lace-cni/lace/lab"
	"github.com/lace-cni/lace/lab/controlplane"
)

var (
	labName    string
	binDir     string
	kubeconfig string
	client     kubernetes.Interface
	rootBefore rootState
	upTime     time.Duration
	skipReason string
	// labDNS: the lab runs cluster DNS, as every lab does by default;
	// LACE_E2E_DNS=0 (make test DNS=0) brings it up without.
	labDNS = os.Getenv("LACE_E2E_DNS") != "0"
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	flag.Parse()
	if testing.Short() {
		skipReason = "needs a lab: not a unit test (-short, make unit); make test runs it"
		return m.Run()
	}
	if reason := prerequisites(); reason != "" {
		if os.Getenv("CI") != "" {
			fmt.Fprintln(os.Stderr, "e2e:", reason)
			return 1
		}
		skipReason = reason
		return m.Run()
	}
	var err error
	if binDir, err = laceBinaries(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	labName = "e2e" + hex.EncodeToString(suffix)
	if rootBefore, err = snapshotRoot(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: snapshot root namespace:", err)
		return 1
	}
	start := time.Now()
	args := []string{"up", "--nodes", "3", "--zones", "2", fmt.Sprintf("--dns=%t", labDNS)}
	out, err := labCmd(args...).CombinedOutput()
	upTime = time.Since(start)
	// Whatever happens from here, the lab goes away again.
	defer func() { _ = labCmd("down").Run() }()
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: lace-lab up: %v\n%s", err, out)
		return 1
	}
	fmt.Printf("e2e: lab %s up in %.1fs\n", labName, upTime.Seconds())
	kubeconfig = strings.TrimSpace(string(must(labCmd("kubeconfig").Output())))
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	client = kubernetes.NewForConfigOrDie(cfg)
	defer writeTimes()
	return m.Run()
}

func must(b []byte, err error) []byte {
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
	}
	return b
}

// prerequisites says why the lab cannot run here, or "" when it can.
func prerequisites() string {
	if os.Geteuid() != 0 {
		return "the lab needs root (network namespaces)"
	}
	if m := controlplane.MissingBinaries(controlplane.DefaultBinDir(), "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl"); len(m) > 0 {
		return fmt.Sprintf("missing %v: run 'make k8s-bins'", m)
	}
	cfg := lab.DefaultConfig()
	cfg.DNS = labDNS
	for _, img := range cfg.Images() {
		if _, err := os.Stat(img); err != nil {
			return fmt.Sprintf("missing image %s: run 'make images' (and 'make coredns' for cluster DNS, or LACE_E2E_DNS=0 to go without)", img)
		}
	}
	if _, err := os.Stat(lab.DefaultConfig().Helm); err != nil {
		return "missing helm: run 'make helm'"
	}
	for _, tool := range []string{"containerd", "runc", "ctr", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			return tool + " is not installed: run 'make deps'"
		}
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "iproute2 (ip) is not installed"
	}
	return ""
}

// laceBinaries returns the directory of the Lace binaries: $LACE_BIN_DIR
// (set by make), or a fresh build.
func laceBinaries() (string, error) {
	if d := os.Getenv("LACE_BIN_DIR"); d != "" {
		if _, err := os.Stat(filepath.Join(d, "lace-lab")); err == nil {
			return d, nil
		}
	}
	d, err := os.MkdirTemp("", "lace-e2e-bin-")
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "build", "-o", d+"/", "../../cmd/...", "../../lab/cmd/...")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build lace binaries: %v\n%s", err, out)
	}
	return d, nil
}

func needLab(t *testing.T) {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	start := time.Now()
	// Registered first, run last: the test's own cleanups count too.
	t.Cleanup(func() {
		took.Lock()
		defer took.Unlock()
		took.tests = append(took.tests, testTime{t.Name(), time.Since(start)})
	})
}

// took records how long each lab test ran, so a run that grew slower
// tells where (CI has about 45 minutes, and this package is its long pole).
var took struct {
	sync.Mutex
	tests []testTime
}

type testTime struct {
	name string
	d    time.Duration
}

// writeTimes writes the lab tests' times, slowest first, to
// $LACE_BIN_DIR/e2e-times.txt (make test's bin directory), and prints the
// slowest ten.
func writeTimes() {
	took.Lock()
	defer took.Unlock()
	slices.SortFunc(took.tests, func(a, b testTime) int { return cmp.Compare(b.d, a.d) })
	var b strings.Builder
	var total time.Duration
	for _, tt := range took.tests {
		total += tt.d
	}
	fmt.Fprintf(&b, "e2e: %d lab tests took %s (the lab came up in %s)\n", len(took.tests), total.Round(time.Second), upTime.Round(time.Second))
	for i, tt := range took.tests {
		line := fmt.Sprintf("  %8s  %s\n", tt.d.Round(100*time.Millisecond), tt.name)
		b.WriteString(line)
		if i < 10 {
			fmt.Print(line)
		}
	}
	if d := os.Getenv("LACE_BIN_DIR"); d != "" {
		if err := os.WriteFile(filepath.Join(d, "e2e-times.txt"), []byte(b.String()), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: write the tests' times:", err)
		}
	}
}

func labCmd(args ...string) *exec.Cmd {
	full := append([]string{args[0], "--name", labName}, args[1:]...)
	return exec.Command(filepath.Join(binDir, "lace-lab"), full...)
}

// kubectl runs the pinned kubectl against the lab.
func kubectl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(controlplane.DefaultBinDir(), "kubectl"), args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// labConfig is the lab's configuration, for the lab package's helpers.
func labConfig() lab.Config {
	c := lab.DefaultConfig()
	c.Name = labName
	return c
}

// podNetNS returns the path of pod's network namespace, found through its
// node's container runtime.
func podNetNS(t testing.TB, pod *corev1.Pod) string {
	t.Helper()
	ns, err := lab.PodNetNS(context.Background(), labConfig(), pod.Namespace, pod.Name)
	if err != nil {
		t.Fatalf("network namespace of %s/%s: %v", pod.Namespace, pod.Name, err)
	}
	return ns
}

func eventually(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	testutil.Eventually(t, timeout, 250*time.Millisecond, what, f)
}
