package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lace-cni/lace/internal/controlplane"
	"github.com/lace-cni/lace/internal/netutil"
)

// EnvLab marks every process a lab starts with the lab's name, so that
// cleanup after a crash finds them.
const EnvLab = "LACE_LAB"

// Status is what the lab daemon reports on its control socket.
type Status struct {
	Name       string       `json:"name"`
	Ready      bool         `json:"ready"`
	Error      string       `json:"error,omitempty"`
	PID        int          `json:"pid"`
	Kubeconfig string       `json:"kubeconfig"`
	APIServer  string       `json:"apiServer"`
	StartedAt  time.Time    `json:"startedAt"`
	UpSeconds  float64      `json:"upSeconds,omitempty"`
	Nodes      []NodeStatus `json:"nodes"`
	Processes  []ProcStatus `json:"processes"`
}

// NodeStatus describes one lab node.
type NodeStatus struct {
	Name        string `json:"name"`
	Zone        string `json:"zone"`
	NetNS       string `json:"netns"`
	IPv4        string `json:"ipv4"`
	IPv6        string `json:"ipv6"`
	KubeletPort int    `json:"kubeletPort"`
	Pods        int    `json:"pods"`
}

// ProcStatus describes one lab process.
type ProcStatus struct {
	Name  string `json:"name"`
	Alive bool   `json:"alive"`
	Log   string `json:"log"`
}

// daemon is the long-lived process behind a running lab: it owns the
// control plane processes, the lab kubelets and the namespaces.
type daemon struct {
	cfg Config
	log *slog.Logger

	mu       sync.Mutex
	status   Status
	cp       *controlplane.ControlPlane
	procs    []*controlplane.Process
	kubelets []*kubelet
	shutdown chan struct{}
	once     sync.Once
	// kubeletErr is the first error a lab kubelet stopped with.
	kubeletErr error
	// components are Lace's own processes (restartable).
	components []*component
}

// RunDaemon brings the lab up and keeps it running until ctx ends or a
// client asks it to shut down; then it removes everything it made.
func RunDaemon(ctx context.Context, cfg Config, log *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	d := &daemon{cfg: cfg, log: log, shutdown: make(chan struct{})}
	d.status = Status{Name: cfg.Name, PID: os.Getpid(), Kubeconfig: cfg.Kubeconfig(), StartedAt: time.Now()}
	if err := os.MkdirAll(cfg.StateDir(), 0o755); err != nil {
		return fmt.Errorf("create state dir: %w", err)
	}
	if err := os.WriteFile(filepath.Join(cfg.StateDir(), "pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return fmt.Errorf("write pid file: %w", err)
	}
	srv, err := d.serveControl()
	if err != nil {
		return err
	}
	defer srv.Close()

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	upErr := d.up(runCtx, &wg)
	d.mu.Lock()
	if upErr != nil {
		d.status.Error = upErr.Error()
		log.Error("lab failed to come up", "err", upErr)
	} else {
		d.status.Ready = true
		d.status.UpSeconds = time.Since(d.status.StartedAt).Seconds()
		log.Info("lab ready", "seconds", d.status.UpSeconds)
	}
	d.mu.Unlock()

	if upErr == nil {
		select {
		case <-ctx.Done():
		case <-d.shutdown:
		}
	} else {
		// Give `lace-lab up` a moment to read the error before cleaning up.
		select {
		case <-time.After(3 * time.Second):
		case <-d.shutdown:
		}
	}
	log.Info("lab shutting down")
	cancel()
	wg.Wait()
	d.teardown()
	return upErr
}

func (d *daemon) up(ctx context.Context, wg *sync.WaitGroup) error {
	c := d.cfg
	if err := setupNetwork(c); err != nil {
		return fmt.Errorf("set up lab network: %w", err)
	}
	cp, err := controlplane.Start(ctx, controlplane.Options{
		BinDir: c.K8sBinDir, Dir: c.StateDir(), ServiceCIDRs: ServiceCIDRs,
		ExtraAPIServerArgs: []string{
			// Kubelets are reached on loopback: see kubelet.register.
			"--kubelet-preferred-address-types=InternalDNS,InternalIP,Hostname",
			"--kubelet-client-certificate=" + filepath.Join(c.StateDir(), "pki", "apiserver-kubelet-client.crt"),
			"--kubelet-client-key=" + filepath.Join(c.StateDir(), "pki", "apiserver-kubelet-client.key"),
		},
		BeforeAPIServer: func(p *controlplane.PKI) error {
			return p.Issue(filepath.Join(p.Dir, "apiserver-kubelet-client.crt"), filepath.Join(p.Dir, "apiserver-kubelet-client.key"),
				"kube-apiserver-kubelet-client", []string{"system:masters"}, nil, nil, false)
		},
	})
	if err != nil {
		return err
	}
	d.mu.Lock()
	d.cp = cp
	d.status.APIServer = cp.APIServerURL
	d.procs = append(d.procs, cp.Processes()...)
	d.mu.Unlock()
	if err := copyFile(cp.AdminKubeconfig, c.Kubeconfig()); err != nil {
		return err
	}
	for _, start := range []func(...string) (*controlplane.Process, error){cp.StartControllerManager, cp.StartScheduler} {
		p, err := start()
		if err != nil {
			return err
		}
		d.mu.Lock()
		d.procs = append(d.procs, p)
		d.mu.Unlock()
	}
	cfg := cp.RESTConfig()
	if err := controlplane.InstallCRDs(ctx, cfg); err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	if err := d.linkBinaries(); err != nil {
		return err
	}
	if c.CNI == CNILace {
		if err := installDefaults(ctx, cfg); err != nil {
			return err
		}
		if err := d.startLace(cp); err != nil {
			return err
		}
	}
	pki := cp.PKI
	servingCert, servingKey := filepath.Join(pki.Dir, "kubelet.crt"), filepath.Join(pki.Dir, "kubelet.key")
	if err := pki.Issue(servingCert, servingKey, "lab-kubelet", nil, []string{"localhost"},
		[]net.IP{net.IPv4(127, 0, 0, 1)}, true); err != nil {
		return err
	}
	for i := 1; i <= c.Nodes; i++ {
		port, err := controlplane.FreePort()
		if err != nil {
			return err
		}
		k := newKubelet(c, i, client, port, d.log)
		if c.CNI == CNIBridge {
			if err := writeBridgeConfig(c, i, k.cni.confDir, filepath.Join(k.dataDir, "ipam")); err != nil {
				return fmt.Errorf("CNI config of %s: %w", k.node, err)
			}
		}
		if err := k.serveAPI(ctx, servingCert, servingKey, pki.CACert); err != nil {
			return err
		}
		d.mu.Lock()
		d.kubelets = append(d.kubelets, k)
		d.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := k.run(ctx); err != nil && ctx.Err() == nil {
				d.log.Error("lab kubelet stopped", "node", k.node, "err", err)
				d.mu.Lock()
				if d.kubeletErr == nil {
					d.kubeletErr = fmt.Errorf("lab kubelet of %s: %w", k.node, err)
				}
				d.mu.Unlock()
			}
		}()
	}
	if err := d.waitReady(ctx, client); err != nil {
		return err
	}
	if c.CNI == CNILace {
		return waitLace(ctx, cfg, c.Nodes, d.alive)
	}
	return nil
}

// alive fails when a lab process has exited.
func (d *daemon) alive() error {
	for _, p := range d.processes() {
		if p.Exited() {
			return fmt.Errorf("%s %v: %s", p.Name, p.ExitError(), p.LogTail(1500))
		}
	}
	return nil
}

// waitReady waits until every node is Ready and the default service
// account exists (pods of Deployments cannot be created before it does).
func (d *daemon) waitReady(ctx context.Context, client kubernetes.Interface) error {
	deadline := time.Now().Add(3 * time.Minute)
	var last string
	for time.Now().Before(deadline) {
		last = ""
		nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			last = err.Error()
		} else {
			ready := 0
			for _, n := range nodes.Items {
				for _, c := range n.Status.Conditions {
					if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
						ready++
					}
				}
			}
			if ready < d.cfg.Nodes {
				last = fmt.Sprintf("%d of %d nodes ready", ready, d.cfg.Nodes)
			}
		}
		if last == "" {
			if _, err := client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{}); err != nil {
				last = "default service account: " + err.Error()
			}
		}
		if last == "" {
			return nil
		}
		d.mu.Lock()
		kerr := d.kubeletErr
		d.mu.Unlock()
		if kerr != nil {
			return kerr
		}
		for _, p := range d.processes() {
			if p.Exited() {
				return fmt.Errorf("%s %v: %s", p.Name, p.ExitError(), p.LogTail(1500))
			}
		}
		if !sleepCtx(ctx, 250*time.Millisecond) {
			return ctx.Err()
		}
	}
	return fmt.Errorf("lab not ready after 3 minutes: %s", last)
}

func (d *daemon) processes() []*controlplane.Process {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]*controlplane.Process(nil), d.procs...)
}

// linkBinaries fills <state>/bin, which leads PATH in pods and exec.
func (d *daemon) linkBinaries() error {
	bin := filepath.Join(d.cfg.StateDir(), "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return err
	}
	link := func(target, name string) error {
		dst := filepath.Join(bin, name)
		_ = os.Remove(dst)
		if err := os.Symlink(target, dst); err != nil {
			return fmt.Errorf("link %s: %w", name, err)
		}
		return nil
	}
	if err := link(filepath.Join(d.cfg.K8sBinDir, "agnhost"), "agnhost"); err != nil {
		return err
	}
	if err := os.MkdirAll(d.cfg.cniPluginDir(), 0o755); err != nil {
		return err
	}
	plugin := filepath.Join(d.cfg.cniPluginDir(), "lace")
	_ = os.Remove(plugin)
	if err := os.Symlink(filepath.Join(d.cfg.LaceBinDir, "lace-cni"), plugin); err != nil {
		return fmt.Errorf("install lace CNI plugin: %w", err)
	}
	for _, b := range []string{"lace-controller", "lace-agent", "lacectl"} {
		if _, err := os.Stat(filepath.Join(d.cfg.LaceBinDir, b)); err == nil {
			if err := link(filepath.Join(d.cfg.LaceBinDir, b), b); err != nil {
				return err
			}
		}
	}
	return nil
}

// teardown stops everything in reverse order and removes the lab's
// namespaces and state. Kubelets have stopped their pods already.
func (d *daemon) teardown() {
	procs := d.processes()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Stop(10 * time.Second)
	}
	if err := netutil.UnmountBPFFS(d.bpffsDir()); err != nil {
		d.log.Error("unmount lab bpffs", "err", err)
	}
	if err := teardownNetwork(d.cfg.Name); err != nil {
		d.log.Error("remove lab namespaces", "err", err)
	}
	if err := os.RemoveAll(d.cfg.StateDir()); err != nil {
		d.log.Error("remove lab state", "err", err)
	}
}

func (d *daemon) snapshot() Status {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.status
	st.Nodes = nil
	for _, k := range d.kubelets {
		v4, v6 := NodeUnderlay(k.index)
		k.mu.Lock()
		n := len(k.pods)
		k.mu.Unlock()
		st.Nodes = append(st.Nodes, NodeStatus{Name: k.node, Zone: k.zone, NetNS: k.nodeNS, IPv4: v4.String(),
			IPv6: v6.String(), KubeletPort: k.apiPort, Pods: n})
	}
	st.Processes = nil
	for _, p := range d.procs {
		st.Processes = append(st.Processes, ProcStatus{Name: p.Name, Alive: !p.Exited(), Log: p.LogPath})
	}
	return st
}

// serveControl serves the daemon's control API on its unix socket.
func (d *daemon) serveControl() (*http.Server, error) {
	sock := d.cfg.Socket()
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", sock, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(d.snapshot())
	})
	mux.HandleFunc("POST /shutdown", func(w http.ResponseWriter, _ *http.Request) {
		d.once.Do(func() { close(d.shutdown) })
		w.WriteHeader(http.StatusAccepted)
	})
	mux.HandleFunc("POST /{action}", func(w http.ResponseWriter, r *http.Request) {
		if err := d.control(r.PathValue("action"), r.URL.Query().Get("target")); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("control socket stopped", "err", err)
		}
	}()
	return srv, nil
}

// control stops, starts or restarts a Lace component of the lab
// (agent/NODE or controller). Stopping a stopped one, or starting a running
// one, is a no-op.
func (d *daemon) control(action, target string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.components {
		if c.name != target {
			continue
		}
		switch action {
		case "stop":
			c.proc.Stop(10 * time.Second)
			d.log.Info("stopped", "component", target)
			return nil
		case "start":
			if !c.proc.Exited() {
				return nil
			}
		case "restart":
			c.proc.Stop(10 * time.Second)
		default:
			return fmt.Errorf("unknown action %q", action)
		}
		if err := c.start(); err != nil {
			return err
		}
		for i, p := range d.procs {
			if p.Name == c.name {
				d.procs[i] = c.proc
			}
		}
		d.log.Info(action+"ed", "component", target)
		return nil
	}
	return fmt.Errorf("no component %q in lab %s (agent/NODE or controller)", target, d.cfg.Name)
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o600)
}
