package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lace-cni/lace/lab/controlplane"
)

// EnvLab marks every process a lab starts with the lab's name, so that
// cleanup after a crash finds them.
const EnvLab = "LACE_LAB"

// Status is what the lab daemon reports on its control socket.
type Status struct {
	Name       string `json:"name"`
	Ready      bool   `json:"ready"`
	Error      string `json:"error,omitempty"`
	PID        int    `json:"pid"`
	Kubeconfig string `json:"kubeconfig"`
	APIServer  string `json:"apiServer"`
	// FabricAPIServer is where nodes and pods reach the API server.
	FabricAPIServer string `json:"fabricAPIServer"`
	// DNS tells that the lab runs cluster DNS (Config.DNS).
	DNS       bool         `json:"dns,omitempty"`
	StartedAt time.Time    `json:"startedAt"`
	UpSeconds float64      `json:"upSeconds,omitempty"`
	Nodes     []NodeStatus `json:"nodes"`
	Processes []ProcStatus `json:"processes"`
}

// NodeStatus describes one lab node.
type NodeStatus struct {
	Name  string `json:"name"`
	Zone  string `json:"zone"`
	NetNS string `json:"netns"`
	IPv4  string `json:"ipv4"`
	IPv6  string `json:"ipv6"`
	// Root is the node's filesystem as the node sees it.
	Root string `json:"root"`
}

// ProcStatus describes one lab process.
type ProcStatus struct {
	Name  string `json:"name"`
	Alive bool   `json:"alive"`
	Log   string `json:"log"`
}

// daemon is the long-lived process behind a running lab: it owns the
// control plane processes, the nodes (their namespaces, containerd and
// kubelet) and the relays between the machine's loopback and the fabric.
type daemon struct {
	cfg Config
	log *slog.Logger

	mu       sync.Mutex
	status   Status
	cp       *controlplane.ControlPlane
	procs    []*controlplane.Process
	nodes    []*node
	shutdown chan struct{}
	once     sync.Once
	// ctl serializes stopping and starting control plane components.
	ctl sync.Mutex
}

// RunDaemon brings the lab up and keeps it running until ctx ends or a
// client asks it to shut down; then it removes everything it made.
func RunDaemon(ctx context.Context, cfg Config, log *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	d := &daemon{cfg: cfg, log: log, shutdown: make(chan struct{})}
	d.status = Status{Name: cfg.Name, PID: os.Getpid(), Kubeconfig: cfg.Kubeconfig(), StartedAt: time.Now(), DNS: cfg.DNS}
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
	upErr := d.up(runCtx)
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
	d.teardown()
	return upErr
}

// auditPolicyYAML logs every write request once (when it completes) at
// Metadata level (who, what, which object; no bodies) and nothing else:
// reads and watches are most of a cluster's requests and would cost the
// lab for nothing.
const auditPolicyYAML = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    verbs: ["create", "update", "patch", "delete", "deletecollection"]
  - level: None
`

func (d *daemon) up(ctx context.Context) error {
	c := d.cfg
	if err := setupNetwork(c); err != nil {
		return fmt.Errorf("set up lab network: %w", err)
	}
	if err := serveEgress(ctx, c, d.log); err != nil {
		return err
	}
	egress := filepath.Join(c.StateDir(), "egress-selector.yaml")
	if err := writeFile(egress, egressConfig(c.EgressSocket()), 0o644); err != nil {
		return err
	}
	auditPolicy := filepath.Join(c.StateDir(), "audit-policy.yaml")
	if err := writeFile(auditPolicy, auditPolicyYAML, 0o644); err != nil {
		return err
	}
	apiV4, apiV6 := APIServerAddrs()
	pkiDir := filepath.Join(c.StateDir(), "pki")
	cp, err := controlplane.Start(ctx, controlplane.Options{
		BinDir: c.K8sBinDir, Dir: c.StateDir(), ServiceCIDRs: ServiceCIDRs,
		ExtraAPIServerArgs: []string{
			// Where the API server sits on the fabric: the kubernetes
			// Service's endpoints, reached through the relay.
			"--advertise-address=" + apiV4.String(),
			"--enable-admission-plugins=NodeRestriction",
			"--kubelet-preferred-address-types=InternalIP",
			"--kubelet-certificate-authority=" + filepath.Join(pkiDir, "ca.crt"),
			"--kubelet-client-certificate=" + filepath.Join(pkiDir, "apiserver-kubelet-client.crt"),
			"--kubelet-client-key=" + filepath.Join(pkiDir, "apiserver-kubelet-client.key"),
			"--egress-selector-config-file=" + egress,
			// Admission webhooks and aggregated API servers are Services
			// the API server dials through the same egress proxy, which
			// dials from the fabric: no node's socket hooks translate a
			// ClusterIP there, so the API server picks an endpoint itself
			// (as a managed control plane outside the cluster network
			// does). On a cluster whose control-plane nodes run Lace, the
			// API server's own sockets reach ClusterIPs.
			"--enable-aggregator-routing=true",
			// Every write, at Metadata level, written as it happens
			// (the log backend's default blocking mode).
			"--audit-policy-file=" + auditPolicy,
			"--audit-log-path=" + c.AuditLog(),
			"--audit-log-format=json",
		},
		BeforeAPIServer: func(p *controlplane.PKI) error {
			if err := p.Issue(filepath.Join(p.Dir, "apiserver-kubelet-client.crt"), filepath.Join(p.Dir, "apiserver-kubelet-client.key"),
				"kube-apiserver-kubelet-client", []string{"system:masters"}, nil, nil, false); err != nil {
				return err
			}
			// Serving names and addresses of a cluster's API server: on
			// the fabric and behind the kubernetes Service (both families).
			return p.Issue(p.ServingCert, p.ServingK, "kube-apiserver", nil,
				[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
				[]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, apiV4.AsSlice(), apiV6.AsSlice(),
					net.ParseIP("10.96.0.1"), net.ParseIP("fd00:96::1")}, true)
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
	apiURL, err := url.Parse(cp.APIServerURL)
	if err != nil {
		return err
	}
	apiPort, _ := strconv.Atoi(apiURL.Port())
	if err := relayAPIServer(ctx, c, apiPort, d.log); err != nil {
		return err
	}
	d.mu.Lock()
	d.status.FabricAPIServer = "https://" + net.JoinHostPort(apiV4.String(), apiURL.Port())
	d.mu.Unlock()
	var kcmArgs []string
	if c.CNI == CNIFlannel {
		kcmArgs = flannelControllerManagerArgs()
	}
	for _, start := range []func() (*controlplane.Process, error){
		func() (*controlplane.Process, error) { return cp.StartControllerManager(kcmArgs...) },
		func() (*controlplane.Process, error) { return cp.StartScheduler() },
	} {
		p, err := start()
		if err != nil {
			return err
		}
		d.mu.Lock()
		d.procs = append(d.procs, p)
		d.mu.Unlock()
	}
	restCfg := cp.RESTConfig()
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	if c.CNI == CNILace {
		// The chart goes in first, as on a cluster whose nodes wait for
		// their network: the DaemonSet's pods land as the nodes register.
		if err := installLace(ctx, c, apiPort); err != nil {
			return err
		}
	}
	if c.DNS {
		if err := installDNS(ctx, client); err != nil {
			return err
		}
	}
	if err := d.startNodes(ctx, cp.PKI, d.status.FabricAPIServer); err != nil {
		return err
	}
	if c.CNI == CNIFlannel {
		if err := d.startFlannel(ctx, client); err != nil {
			return err
		}
	}
	if err := d.waitReady(ctx, client); err != nil {
		return err
	}
	if c.CNI == CNILace {
		if err := waitLace(ctx, restCfg, c.Nodes, d.alive); err != nil {
			return err
		}
	}
	if c.DNS {
		return waitDNS(ctx, client, d.alive)
	}
	return nil
}

// startNodes brings every node's containerd up with the lab's images, in
// parallel, then starts the kubelets.
func (d *daemon) startNodes(ctx context.Context, pki *controlplane.PKI, apiServer string) error {
	c := d.cfg
	for i := 1; i <= c.Nodes; i++ {
		d.nodes = append(d.nodes, newNode(c, i, d.log))
	}
	if err := d.eachNode(func(n *node) error { return n.start(ctx, pki, apiServer, c.Images()) }); err != nil {
		return err
	}
	for _, n := range d.nodes {
		if err := n.startKubelet(); err != nil {
			return err
		}
	}
	d.collectProcs()
	return nil
}

// startFlannel brings every node's flannel and kube-proxy up, in parallel.
func (d *daemon) startFlannel(ctx context.Context, client kubernetes.Interface) error {
	if err := flannelRBAC(ctx, client); err != nil {
		return err
	}
	return d.eachNode(func(n *node) error { return n.startFlannel(ctx, client) })
}

// eachNode runs f on every node at once, then adds what they started to
// the lab's processes, failed or not (teardown stops them).
func (d *daemon) eachNode(f func(*node) error) error {
	errs := make([]error, len(d.nodes))
	var wg sync.WaitGroup
	for i, n := range d.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(n)
		}()
	}
	wg.Wait()
	d.collectProcs()
	return errors.Join(errs...)
}

// collectProcs adds the nodes' processes to the lab's list.
func (d *daemon) collectProcs() {
	d.mu.Lock()
	defer d.mu.Unlock()
	have := map[*controlplane.Process]bool{}
	for _, p := range d.procs {
		have[p] = true
	}
	for _, n := range d.nodes {
		for _, p := range n.processes() {
			if !have[p] {
				d.procs = append(d.procs, p)
			}
		}
	}
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

// teardown stops the nodes (and everything that ran in them), then the
// control plane, and removes the lab's namespaces and state.
func (d *daemon) teardown() {
	d.mu.Lock()
	nodes := d.nodes
	d.mu.Unlock()
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := n.stop(); err != nil {
				d.log.Error("stop node", "node", n.name, "err", err)
			}
		}()
	}
	wg.Wait()
	procs := d.processes()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Stop(10 * time.Second)
	}
	if err := Cleanup(d.cfg); err != nil {
		d.log.Error("clean up lab", "err", err)
	}
}

func (d *daemon) snapshot() Status {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.status
	st.Nodes = nil
	for _, n := range d.nodes {
		v4, v6 := NodeUnderlay(n.index)
		st.Nodes = append(st.Nodes, NodeStatus{Name: n.name, Zone: n.zone, NetNS: n.cfg.NetNS(n.name),
			IPv4: v4.String(), IPv6: v6.String(), Root: n.cfg.NodeRoot(n.name)})
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
	mux.HandleFunc("POST /components/{name}/{action}", d.controlComponent)
	mux.HandleFunc("POST /nodes/{name}/reboot", d.rebootNode)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("control socket stopped", "err", err)
		}
	}()
	return srv, nil
}

// controlComponent stops or starts etcd or the API server: the outages a
// control plane has, for the lab's chaos runs. The process list follows,
// so that status shows the process that runs.
func (d *daemon) controlComponent(w http.ResponseWriter, r *http.Request) {
	d.mu.Lock()
	cp := d.cp
	d.mu.Unlock()
	if cp == nil {
		http.Error(w, "the control plane is not up yet", http.StatusConflict)
		return
	}
	d.ctl.Lock()
	defer d.ctl.Unlock()
	name, action := r.PathValue("name"), r.PathValue("action")
	var p *controlplane.Process
	var err error
	switch action {
	case "stop":
		p, err = cp.StopComponent(name)
	case "start":
		p, err = cp.StartComponent(r.Context(), name)
	default:
		err = fmt.Errorf("unknown action %q (stop or start)", action)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	d.log.Info("control plane component", "name", name, "action", action)
	d.mu.Lock()
	for i, q := range d.procs {
		if q.Name == p.Name {
			d.procs[i] = p
		}
	}
	d.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o600)
}
