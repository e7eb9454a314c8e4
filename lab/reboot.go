package lab

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"k8s.io/client-go/kubernetes"

	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab/controlplane"
)

// A reboot is a power cycle: every process of the node dies at once, and
// what lived in memory goes with them (the node's network namespace with
// its links, routes, addresses and eBPF programs; /run; the bpffs and its
// pins). What lived on disk stays: /etc, /opt, /var, the kubelet's and
// containerd's directories. Then the node boots: a fresh network
// namespace on the fabric, containerd, the kubelet, which finds its pods'
// sandboxes gone and makes them again.

// Reboot power-cycles node (a node name, or node/NAME) of lab c and
// returns once its kubelet runs again; the kubelet registering, and its
// pods coming back, are the caller's to await.
func Reboot(ctx context.Context, c Config, node string) error {
	node = strings.TrimPrefix(node, "node/")
	return daemonPost(ctx, c, "/nodes/"+node+"/reboot", 3*time.Minute)
}

// daemonPost asks the lab's daemon for an action on its control socket.
func daemonPost(ctx context.Context, c Config, path string, timeout time.Duration) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://lab"+path, nil)
	if err != nil {
		return err
	}
	hc := controlClient(c)
	hc.Timeout = timeout
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("%s in lab %s: %w", path, c.Name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		b := make([]byte, 4096)
		n, _ := resp.Body.Read(b)
		return fmt.Errorf("%s in lab %s: %s: %s", path, c.Name, resp.Status, strings.TrimSpace(string(b[:n])))
	}
	return nil
}

// rebootNode serves POST /nodes/{name}/reboot.
func (d *daemon) rebootNode(w http.ResponseWriter, r *http.Request) {
	d.mu.Lock()
	cp := d.cp
	var n *node
	for _, m := range d.nodes {
		if m.name == r.PathValue("name") {
			n = m
		}
	}
	d.mu.Unlock()
	if cp == nil || n == nil {
		http.Error(w, fmt.Sprintf("no node %q running in lab %s", r.PathValue("name"), d.cfg.Name), http.StatusNotFound)
		return
	}
	d.ctl.Lock()
	defer d.ctl.Unlock()
	start := time.Now()
	// A client that gives up must not leave the node powered off.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 3*time.Minute)
	defer cancel()
	if err := d.reboot(ctx, n); err != nil {
		d.log.Error("reboot", "node", n.name, "err", err)
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	d.log.Info("node rebooted", "node", n.name, "seconds", time.Since(start).Seconds())
	w.WriteHeader(http.StatusNoContent)
}

// reboot power-cycles n. The node's processes in the lab's list are
// replaced by the new ones, so that status (and alive) tell of the
// processes that run.
func (d *daemon) reboot(ctx context.Context, n *node) error {
	old := n.processes()
	// The holder is PID 1 of the node's PID namespace: when it ends, the
	// kernel kills every process of the node at once, containers
	// included. No process gets to shut down cleanly.
	n.holder.Stop(0)
	for _, p := range old {
		p.Stop(0)
	}
	if err := removeCgroupRoot(n.cgroupRoot()); err != nil {
		return fmt.Errorf("power off %s: %w", n.name, err)
	}
	if err := d.renewNetNS(ctx, n); err != nil {
		return err
	}
	// The disk kept the node's images, files and certificates: boot
	// imports nothing and writes nothing.
	if err := n.boot(ctx, nil); err != nil {
		return fmt.Errorf("boot %s: %w", n.name, err)
	}
	if err := n.startKubelet(); err != nil {
		return fmt.Errorf("boot %s: %w", n.name, err)
	}
	if d.cfg.CNI == CNIFlannel {
		d.mu.Lock()
		cp := d.cp
		d.mu.Unlock()
		client, err := kubernetes.NewForConfig(cp.RESTConfig())
		if err != nil {
			return err
		}
		if err := n.startFlannel(ctx, client); err != nil {
			return fmt.Errorf("boot %s: %w", n.name, err)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var procs []*controlplane.Process
	for _, p := range d.procs {
		gone := false
		for _, o := range old {
			gone = gone || p == o
		}
		if !gone {
			procs = append(procs, p)
		}
	}
	d.procs = append(procs, n.processes()...)
	return nil
}

// renewNetNS deletes n's network namespace, waits until the kernel has
// destroyed it (its port on the fabric goes with it), and makes it again
// as the lab first did, with the same MAC on eth0.
func (d *daemon) renewNetNS(ctx context.Context, n *node) error {
	// The NIC keeps its MAC across a reboot, as the fabric's neighbours
	// expect.
	eth0, err := netutil.GetLink(netutil.Path(d.cfg.NetNS(n.name)), "eth0")
	if err != nil {
		return fmt.Errorf("the fabric port of %s: %w", n.name, err)
	}
	if err := netutil.DeleteNamed(d.cfg.NetNS(n.name)); err != nil {
		return fmt.Errorf("delete the network namespace of %s: %w", n.name, err)
	}
	fabric := netutil.Path(d.cfg.NetNS("fabric"))
	deadline := time.Now().Add(30 * time.Second)
	for {
		h, err := netutil.Handle(fabric)
		if err != nil {
			return err
		}
		_, err = h.LinkByName(n.name)
		h.Close()
		if errors.As(err, &netlink.LinkNotFoundError{}) {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("the fabric port of " + n.name + " outlived its namespace by 30s")
		}
		if !sleepCtx(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
	return setupNode(d.cfg, n.index, eth0.MAC)
}
