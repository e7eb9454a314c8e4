package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
)

// TestNodeCannotClaimOthers writes, with agent n1's own token, what the
// node restriction lets through (its own NetworkEndpoints, with anything
// in them) to take other nodes' backends away: one claiming the API
// server's address in another network, and one squatting the name of a
// pod of n2 (then claiming that pod's addresses). Every node keeps serving
// the kubernetes Service and n2's pod behind its Service; lace-controller
// deletes both objects and n2's agent writes its pod's record.
func TestNodeCannotClaimOthers(t *testing.T) {
	needLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	admin := laceClient(t)
	n1 := agentClient(t, "n1")
	k, err := client.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kvip := netip.MustParseAddr(k.Spec.ClusterIP)
	sls, err := client.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=kubernetes"})
	if err != nil || len(sls.Items) == 0 || len(sls.Items[0].Endpoints) == 0 {
		t.Fatalf("kubernetes EndpointSlice: %v %v", err, sls)
	}
	apiAddr := sls.Items[0].Endpoints[0].Addresses[0]
	nodes := []string{"n1", "n2", "n3"}
	// served: every node's table has vip:port with a backend at addr.
	served := func(vip netip.Addr, port uint16, addr string) error {
		for _, node := range nodes {
			table, err := semTable(node)
			if err != nil {
				return err
			}
			e := semEntry(table, vip, 6, port)
			if e == nil || e.Drop || len(e.Backends) == 0 {
				return fmt.Errorf("%s serves %s:%d with %s", node, vip, port, semDescribe(e))
			}
			found := false
			for _, b := range e.Backends {
				found = found || b.Addr.String() == addr
			}
			if !found {
				return fmt.Errorf("%s serves %s:%d without %s: %s", node, vip, port, addr, semDescribe(e))
			}
		}
		return nil
	}
	// stays: served holds throughout window (each node's agent applies a
	// NetworkEndpoint change within a second; a regression shows as a
	// lost backend well inside it).
	stays := func(what string, window time.Duration, f func() error) {
		t.Helper()
		for end := time.Now().Add(window); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
			if err := f(); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		}
	}
	eventually(t, 30*time.Second, "kubernetes Service served", func() error { return served(kvip, 443, apiAddr) })

	// 1. The API server's address, claimed in another network by a
	// NetworkEndpoint of n1 named after no pod.
	forged := &lacev1.NetworkEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "trust-forged",
		Labels: map[string]string{"lace-cni.io/node": "n1"}},
		Spec: lacev1.NetworkEndpointSpec{Network: "elsewhere", Node: "n1", Addresses: []lacev1.IPAddress{lacev1.IPAddress(apiAddr)}}}
	if err := n1.Create(ctx, forged); err != nil {
		t.Fatalf("n1 creates a NetworkEndpoint of its own node (the policy lets it): %v", err)
	}
	t.Cleanup(func() { _ = admin.Delete(context.Background(), forged) })
	// Agents need no reconcile for a NetworkEndpoint's creation; a new
	// Service makes every one recompute with the forged object in its
	// cache: once its VIP is in every node's table, the tables reflect it.
	kick := semService(t, "trust-kick", "trust-nothing", nil)
	kickVIP := clusterIPs(kick)[0]
	eventually(t, 30*time.Second, "every node recomputed its services", func() error {
		for _, node := range nodes {
			table, err := semTable(node)
			if err != nil {
				return err
			}
			if semEntry(table, kickVIP, 6, 80) == nil {
				return fmt.Errorf("%s has no entry for %s yet", node, kickVIP)
			}
		}
		return nil
	})
	stays("kubernetes Service after n1 claims the API server address", 8*time.Second, func() error { return served(kvip, 443, apiAddr) })
	eventually(t, 30*time.Second, "forged NetworkEndpoint deleted by lace-controller", func() error {
		if err := admin.Get(ctx, crclient.ObjectKeyFromObject(forged), &lacev1.NetworkEndpoint{}); err == nil {
			return fmt.Errorf("still there")
		}
		return nil
	})

	// 2. n1 squats the NetworkEndpoint name of a pod about to start on n2.
	squat := &lacev1.NetworkEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "trust-web",
		Labels: map[string]string{"lace-cni.io/node": "n1"}},
		Spec: lacev1.NetworkEndpointSpec{Network: "elsewhere", Node: "n1", Addresses: []lacev1.IPAddress{"10.66.0.1"}}}
	if err := n1.Create(ctx, squat); err != nil {
		t.Fatalf("n1 squats: %v", err)
	}
	t.Cleanup(func() { _ = admin.Delete(context.Background(), squat) })
	pod := appPod(t, "trust-web", "default", "trust-web", "n2")
	svc := dualStackService(t, "trust-web", "trust-web", nil)
	waitEndpoints(t, svc, 1)
	v4, _ := podAddrs(pod)
	var vip netip.Addr
	for _, a := range clusterIPs(svc) {
		if a.Is4() {
			vip = a
		}
	}
	// Once the pod has its address, n1 points its squat at it (refused
	// when lace-controller already deleted it: then n1 tries again).
	var s lacev1.NetworkEndpoint
	if err := n1.Get(ctx, crclient.ObjectKeyFromObject(squat), &s); err == nil && s.Spec.Node == "n1" {
		s.Spec.Addresses = []lacev1.IPAddress{lacev1.IPAddress(v4.String())}
		_ = n1.Update(ctx, &s)
	} else {
		s = *squat.DeepCopy()
		s.ResourceVersion = ""
		s.Spec.Addresses = []lacev1.IPAddress{lacev1.IPAddress(v4.String())}
		_ = n1.Create(ctx, &s)
	}
	eventually(t, 60*time.Second, "n2's own NetworkEndpoint of its pod", func() error {
		var ne lacev1.NetworkEndpoint
		if err := admin.Get(ctx, crclient.ObjectKeyFromObject(squat), &ne); err != nil {
			return err
		}
		if ne.Spec.Node != "n2" || ne.Spec.Network != "default" {
			return fmt.Errorf("NetworkEndpoint trust-web: node %s network %s, want n2's in default", ne.Spec.Node, ne.Spec.Network)
		}
		return nil
	})
	eventually(t, 30*time.Second, "n2's pod served", func() error { return served(vip, 80, v4.String()) })
	stays("n2's pod and the kubernetes Service", 5*time.Second, func() error {
		if err := served(kvip, 443, apiAddr); err != nil {
			return err
		}
		return served(vip, 80, v4.String())
	})
}
