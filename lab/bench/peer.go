package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"text/tabwriter"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
)

// The peer cluster: a flannel lab (lace-lab up --cni flannel), flannel's
// vxlan backend and kube-proxy in nftables mode on every node, the setup
// k3s ships. Its paths run in the same rounds as Lace's, interleaved, on
// the same machine; only the cluster differs.

// loadWorld is what the load benchmark sets up on a lab (setupLoadWorld):
// an endpoint pod on each node, each behind a NodePort Service, and a
// client pod on peerNode.
type loadWorld struct {
	c               lab.Config
	ext             string // the external host's namespace
	srv1, srv2, cli benchPod
	vip1            netip.Addr // load-np1's ClusterIP (srv1 behind port 81)
	np2             int32      // load-np2's NodePort (srv2)
}

// setupLoadWorld sets the load benchmark's world up on the lab name,
// Lace's or the flannel peer's. cleanup undoes it all, also after an
// error.
func setupLoadWorld(ctx context.Context, name string) (w loadWorld, cleanup func(), err error) {
	var undo []func()
	cleanup = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	cs, c, err := fastClient(name)
	if err != nil {
		return w, cleanup, err
	}
	w.c, w.ext = c, netutil.Path(c.NetNS("external"))
	if err := freshNamespace(ctx, cs, loadNS); err != nil {
		return w, cleanup, err
	}
	undo = append(undo, func() { _ = cs.CoreV1().Namespaces().Delete(context.Background(), loadNS, metav1.DeleteOptions{}) })
	pods, err := runPods(ctx, cs, c, loadNS, map[string]string{"load-srv1": laceNode, "load-srv2": peerNode, "load-cli": peerNode})
	if err != nil {
		return w, cleanup, err
	}
	w.srv1, w.srv2, w.cli = pods["load-srv1"], pods["load-srv2"], pods["load-cli"]
	for _, p := range []benchPod{w.srv1, w.srv2} {
		stop, err := serveOneExchange(p.ns, fmt.Sprintf(":%d", loadConnPort))
		if err != nil {
			return w, cleanup, err
		}
		undo = append(undo, stop)
	}
	// The external host reaches the pod on peerNode through that node (on
	// Lace's lab it routes pod addresses over every node, equal cost,
	// otherwise).
	peerV4, _ := lab.NodeUnderlay(2)
	direct := netip.PrefixFrom(w.srv2.ip, 32)
	if err := netutil.EnsureRoute(w.ext, direct, peerV4, "eth0"); err != nil {
		return w, cleanup, fmt.Errorf("external host: route to %s: %w", w.srv2.ip, err)
	}
	undo = append(undo, func() { _ = netutil.DeleteRoute(w.ext, direct, "eth0") })
	if w.vip1, _, err = loadService(ctx, cs, "load-np1", "load-srv1"); err != nil {
		return w, cleanup, err
	}
	if _, w.np2, err = loadService(ctx, cs, "load-np2", "load-srv2"); err != nil {
		return w, cleanup, err
	}
	return w, cleanup, nil
}

// shapes are the world's two proxied paths, each followed by its direct
// reference: the external host through peerNode's NodePort to the pod on
// peerNode, and the client pod through load-np1's ClusterIP to the pod on
// laceNode. proxy and ref prefix their names; lace marks the proxied
// paths as Lace's.
func (w loadWorld) shapes(proxy, ref string, lace bool) []loadPath {
	peerV4, _ := lab.NodeUnderlay(2)
	paths := pairPaths(nil, proxy+"external -> "+peerNode+" NodePort -> pod on "+peerNode, w.ext, at(peerV4, w.np2), lace,
		ref+"external -> pod on "+peerNode+" direct", at(w.srv2.ip, loadConnPort), w.srv2.ns)
	return pairPaths(paths, proxy+"pod on "+peerNode+" -> ClusterIP -> pod on "+laceNode, w.cli.ns, at(w.vip1, 81), lace,
		ref+"pod on "+peerNode+" -> pod on "+laceNode+" direct", at(w.srv1.ip, loadConnPort), w.srv1.ns)
}

// at is a's port port.
func at(a netip.Addr, port int32) netip.AddrPort { return netip.AddrPortFrom(a, uint16(port)) }

// printVersus prints Lace's paths beside the peer cluster's of the same
// shape (versus: pairs of indices into paths, Lace's first).
func printVersus(paths []loadPath, versus [][2]int, conns [][]connRound, rr []rrRun, peerLab string) {
	fmt.Printf("Lace beside the peer cluster (lab %s: flannel %s vxlan, kube-proxy nftables), from the rounds above\n", peerLab, lab.FlannelVersion)
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "Lace path\tLace conns/s\tflannel conns/s\tratio\tLace rr p50\tflannel rr p50\tratio (95% CI)\t")
	for _, v := range versus {
		l, f := v[0], v[1]
		lRate, fRate := medianPerS(conns[l]), medianPerS(conns[f])
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.2f\t%s\t%s\t%.3f (%s)\t\n", paths[l].name, lRate, fRate, lRate/fRate,
			us(rr[l].median()), us(rr[f].median()), float64(rr[l].median())/float64(rr[f].median()),
			ciString(medianRatioCI(sample(rr[l].all), sample(rr[f].all))))
	}
	tw.Flush()
	fmt.Println("conns/s ratio = Lace / flannel (higher is better); request/response p50 ratio = Lace / flannel (lower is better)")
	fmt.Println()
}
