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

// flannelLoadPaths sets up on the flannel lab name what benchLoad sets up
// on Lace's: an endpoint pod on each node, a client pod on peerNode,
// Services load-np1 and load-np2, and returns the two paths of the same
// shapes as Lace's with their direct references: the external host through
// peerNode's NodePort to the pod on peerNode, and the client pod through
// load-np1's ClusterIP to the pod on laceNode. cleanup undoes it all.
func flannelLoadPaths(ctx context.Context, name string) (paths []loadPath, cleanup func(), err error) {
	var undo []func()
	cleanup = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	cs, c, err := fastClient(name)
	if err != nil {
		return nil, cleanup, err
	}
	if err := freshNamespace(ctx, cs, loadNS); err != nil {
		return nil, cleanup, err
	}
	undo = append(undo, func() { _ = cs.CoreV1().Namespaces().Delete(context.Background(), loadNS, metav1.DeleteOptions{}) })
	pods, err := runPods(ctx, cs, c, loadNS, map[string]string{"load-srv1": laceNode, "load-srv2": peerNode, "load-cli": peerNode})
	if err != nil {
		return nil, cleanup, err
	}
	srv1, srv2, cli := pods["load-srv1"], pods["load-srv2"], pods["load-cli"]
	for _, p := range []benchPod{srv1, srv2} {
		stop, err := serveOneExchange(p.ns, fmt.Sprintf(":%d", loadConnPort))
		if err != nil {
			return nil, cleanup, err
		}
		undo = append(undo, stop)
	}
	ext := netutil.Path(c.NetNS("external"))
	peerV4, _ := lab.NodeUnderlay(2)
	// The external host reaches the pod on peerNode straight through that
	// node, as on Lace's lab.
	direct := netip.PrefixFrom(srv2.ip, 32)
	if err := netutil.EnsureRoute(ext, direct, peerV4, "eth0"); err != nil {
		return nil, cleanup, fmt.Errorf("external host: route to %s: %w", srv2.ip, err)
	}
	undo = append(undo, func() { _ = netutil.DeleteRoute(ext, direct, "eth0") })
	vip1, _, err := loadService(ctx, cs, "load-np1", "load-srv1")
	if err != nil {
		return nil, cleanup, err
	}
	_, np2, err := loadService(ctx, cs, "load-np2", "load-srv2")
	if err != nil {
		return nil, cleanup, err
	}
	at := func(a netip.Addr, port int32) netip.AddrPort { return netip.AddrPortFrom(a, uint16(port)) }
	paths = pairPaths(paths, "flannel: external -> "+peerNode+" NodePort -> pod on "+peerNode, ext, at(peerV4, np2), false,
		"flannel: external -> pod on "+peerNode+" direct", at(srv2.ip, loadConnPort), srv2.ns)
	paths = pairPaths(paths, "flannel: pod on "+peerNode+" -> ClusterIP -> pod on "+laceNode, cli.ns, at(vip1, 81), false,
		"flannel: pod on "+peerNode+" -> pod on "+laceNode+" direct", at(srv1.ip, loadConnPort), srv1.ns)
	return paths, cleanup, nil
}

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
