package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"

	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
)

// benchCNIAdd times CNI ADD for n pods on node n1 of the lab with lace-cni,
// and the same with the reference bridge + host-local plugins in a scratch
// node namespace, both invoked exactly as the lab kubelet invokes them.
// The pods are real API objects bound to n1, as a kubelet's pods are when
// it calls ADD (the agent reads them from its cache of the node's pods),
// with a node selector n1 lacks, so that its kubelet refuses them instead
// of starting them too. (Unbound, as they were, each ADD read its pod from
// the API server: about 6.6 ms that no kubelet's ADD pays.)
func benchCNIAdd(ctx context.Context, name string, n int) error {
	cs, c, err := labClient(name)
	if err != nil {
		return err
	}
	// Each pod's namespace is made in n1 (its /proc shows only its own
	// processes, so a machine's namespace file cannot be named there):
	// lace-cni gets the node's path, the bridge plugin, run from the
	// machine, the machine's path to the same namespace.
	type pod struct{ name, uid, netns, nodePath, machinePath string }
	var pods []pod
	for i := range n {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cni-%03d", i), Namespace: "default"},
			Spec: corev1.PodSpec{NodeName: "n1", NodeSelector: map[string]string{"bench.lace.dev/never": "true"},
				Containers: []corev1.Container{{Name: "pause", Image: "registry.k8s.io/pause:3.10"}}}}
		got, err := cs.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		ns := c.Name + "-p-" + string(uuid.NewUUID())
		nodePath, machinePath, err := lab.CreateNodeNetNS(c, "n1", ns)
		if err != nil {
			return err
		}
		pods = append(pods, pod{name: got.Name, uid: string(got.UID), netns: ns, nodePath: nodePath, machinePath: machinePath})
	}
	defer func() {
		for _, p := range pods {
			_ = cs.CoreV1().Pods("default").Delete(context.Background(), p.name, metav1.DeleteOptions{})
			_ = lab.DeleteNodeNetNS(c, "n1", p.netns)
		}
	}()

	// lace-cni runs as node n1's containerd runs it: in the node's network
	// and mount namespaces, with the config the agent's DaemonSet installed.
	laceCNI, err := lab.NewNodeCNI(c, "n1", filepath.Join(c.StateDir(), "bench-cache"))
	if err != nil {
		return err
	}

	// The peer runs in a node namespace of its own, with its own bridge.
	peerNode := c.Name + "-n9"
	if err := netutil.CreateNamed(peerNode); err != nil {
		return err
	}
	defer netutil.DeleteNamed(peerNode)
	peerDir := filepath.Join(c.StateDir(), "bench-bridge")
	if err := lab.WriteBridgeConfig(9, filepath.Join(peerDir, "net.d"), filepath.Join(peerDir, "ipam")); err != nil {
		return err
	}
	bridgeCNI := lab.NewNetNSCNI(peerNode, filepath.Join(peerDir, "net.d"), filepath.Join(peerDir, "cache"), []string{c.CNIBinDir})

	// run ADDs every pod, one after the other or all at once (as a
	// kubelet starting a burst of pods does), then DELs them: each ADD's
	// latency, sorted, and the time until the last ADD returned.
	run := func(cni *lab.NodeCNI, id string, inNode, together bool) ([]time.Duration, time.Duration, error) {
		path := func(p pod) string {
			if inNode {
				return p.nodePath
			}
			return p.machinePath
		}
		lat := make([]time.Duration, len(pods))
		errs := make([]error, len(pods))
		add := func(i int) {
			p := pods[i]
			t := time.Now()
			if _, err := cni.Add(ctx, lab.PodRuntimeConf(id+p.uid, path(p), "default", p.name, p.uid)); err != nil {
				errs[i] = fmt.Errorf("ADD %s: %w", p.name, err)
			}
			lat[i] = time.Since(t)
		}
		start := time.Now()
		if together {
			var wg sync.WaitGroup
			for i := range pods {
				wg.Go(func() { add(i) })
			}
			wg.Wait()
		} else {
			for i := range pods {
				if add(i); errs[i] != nil {
					break
				}
			}
		}
		wall := time.Since(start)
		// Every pod is deleted, whatever failed: the ADDs' errors first.
		for _, p := range pods {
			if err := cni.Del(ctx, lab.PodRuntimeConf(id+p.uid, path(p), "default", p.name, p.uid)); err != nil {
				errs = append(errs, fmt.Errorf("DEL %s: %w", p.name, err))
			}
		}
		if err := errors.Join(errs...); err != nil {
			return nil, 0, err
		}
		slices.Sort(lat)
		return lat, wall, nil
	}
	q := func(l []time.Duration, p int) time.Duration { return l[min(len(l)-1, len(l)*p/100)] }
	for _, together := range []bool{false, true} {
		// Container IDs of their own per mode: the agent's records of the
		// first mode's pods, written after the ADD, are not the second's.
		mode := fmt.Sprintf("%t-", together)
		laceLat, laceWall, err := run(laceCNI, "lace-"+mode, true, together)
		if err != nil {
			return fmt.Errorf("lace-cni: %w", err)
		}
		peerLat, peerWall, err := run(bridgeCNI, "bridge-"+mode, false, together)
		if err != nil {
			return fmt.Errorf("bridge: %w", err)
		}
		how := "one after the other"
		if together {
			how = "all at once"
		}
		fmt.Printf("CNI ADD latency over %d pods, %s (plugin run in the node's namespaces, as its containerd runs it)\n", n, how)
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "\tLace (lace-cni + agent)\tpeer (bridge + host-local)\tratio\t")
		for _, p := range []int{50, 99} {
			fmt.Fprintf(tw, "p%d\t%s\t%s\t%.2f\t\n", p, q(laceLat, p).Round(10*time.Microsecond), q(peerLat, p).Round(10*time.Microsecond),
				float64(q(laceLat, p))/float64(q(peerLat, p)))
		}
		fmt.Fprintf(tw, "pods/s\t%.0f\t%.0f\t%.2f\t\n", float64(n)/laceWall.Seconds(), float64(n)/peerWall.Seconds(), laceWall.Seconds()/peerWall.Seconds())
		tw.Flush()
	}
	fmt.Println("ratio = Lace / peer for latency, peer / Lace for pods/s (lower is better)")
	return nil
}
