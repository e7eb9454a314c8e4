package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	cnitypes "github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/podnet"
	"github.com/lace-cni/lace/pkg/cniapi"
)

// CNI error codes (the spec's well-known ones and Lace's own >= 100).
const (
	errInvalidConfig  = 7
	errTryAgainLater  = 11
	errNoBinding      = 100
	errNoAddress      = 101
	errNetworkMissing = 102
)

type cniError struct {
	code uint
	msg  string
}

func (e *cniError) Error() string { return e.msg }

func cniErr(code uint, format string, args ...any) error {
	return &cniError{code: code, msg: fmt.Sprintf(format, args...)}
}

// Serve serves lace-cni on the agent's unix socket until ctx ends.
func (s *Server) Serve(ctx context.Context) error {
	ln, err := listenCNI(s.opts.CNISocket)
	if err != nil {
		return err
	}
	// The body is read before the handler runs a request, so a slow or
	// stuck writer holds a connection for ReadTimeout at most.
	srv := &http.Server{Handler: s.cniHandler(), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		MaxHeaderBytes: 16 << 10}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// cniHandler answers lace-cni's requests: a CNI result or a CNI error.
func (s *Server) cniHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /cni", func(w http.ResponseWriter, r *http.Request) {
		var req cniapi.Request
		resp := cniapi.Response{}
		if err := decodeCNIRequest(w, r, &req); err != nil {
			resp.Error = &cniapi.Error{Code: errInvalidConfig, Msg: err.Error()}
			s.log.Info("CNI request refused", "err", err)
		} else {
			start := time.Now()
			res, err := s.Handle(r.Context(), req)
			if err != nil {
				var ce *cniError
				code := uint(999)
				if errors.As(err, &ce) {
					code = ce.code
				}
				resp.Error = &cniapi.Error{Code: code, Msg: err.Error()}
				s.log.Info("CNI request failed", "command", req.Command, "container", req.ContainerID, "err", err)
			} else {
				resp.Result = res
				s.log.Debug("CNI request", "command", req.Command, "container", req.ContainerID, "took", time.Since(start))
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(resp)
	})
	return mux
}

func (s *Server) Handle(ctx context.Context, req cniapi.Request) (json.RawMessage, error) {
	switch req.Command {
	case "ADD", "DEL", "CHECK":
		// The checkpoint takes an endpoint without a container ID for
		// one rebuilt from the kernel: a request naming none, or one the
		// CNI spec does not allow (lace-cni never sends either), is no
		// runtime's and is refused before it is looked up.
		if !cniapi.ValidContainerID(req.ContainerID) {
			return nil, cniErr(4, "%s: container ID %q is not a valid CNI container ID", req.Command, req.ContainerID)
		}
	}
	switch req.Command {
	case "ADD":
		defer s.health.Kick()
		return s.cmdAdd(ctx, req)
	case "DEL":
		defer s.health.Kick()
		return nil, s.cmdDel(ctx, req)
	case "CHECK":
		return nil, s.cmdCheck(req)
	case "STATUS":
		return nil, s.cmdStatus()
	case "GC":
		return nil, s.cmdGC(ctx, req)
	}
	return nil, cniErr(4, "unsupported CNI command %q", req.Command)
}

// CNI STATUS error codes (CNI 1.1): 50, the plugin cannot serve ADD; 51,
// existing pods may also have limited connectivity.
const (
	errUnavailable         = 50
	errLimitedConnectivity = 51
)

// cmdStatus answers CNI STATUS: the data plane is programmed and the node
// can carry pod traffic (health.go). A runtime that calls STATUS (CNI 1.1,
// containerd 2.x) then reports the node's network as not ready instead of
// starting pods that cannot talk.
func (s *Server) cmdStatus() error {
	if reason, msg := s.health.Problem(); reason != "" {
		return cniErr(errLimitedConnectivity, "node %s cannot carry pod traffic: %s: %s", s.opts.NodeName, reason, msg)
	}
	return s.Readyz()
}

// Readyz says whether the data plane has been programmed (the agent's
// readiness probe: a rolling update moves on once forwarding is back,
// whatever the node's underlay).
func (s *Server) Readyz() error {
	if !s.sync.Applied() {
		return cniErr(errUnavailable, "lace-agent on %s has not programmed its data plane yet", s.opts.NodeName)
	}
	return nil
}

func (s *Server) cmdAdd(ctx context.Context, req cniapi.Request) (json.RawMessage, error) {
	var conf cniapi.NetConf
	if err := json.Unmarshal(req.Config, &conf); err != nil {
		return nil, cniErr(errInvalidConfig, "parse network config: %v", err)
	}
	// A CNI version the result cannot be given in is refused before
	// anything is allocated: found only at the end, the ADD would fail
	// with the pod attached, its address, interface and NetworkEndpoint
	// left behind.
	if _, err := s.result(conf.CNIVersion, Endpoint{}); err != nil {
		return nil, err
	}
	if e, ok := s.cp.get(req.ContainerID); ok && e.Ready {
		if e.ContainerID == "" {
			// Rebuilt from the kernel after the checkpoint was lost: the
			// runtime's retry names the container again.
			e.ContainerID, e.NetNS = req.ContainerID, req.NetNS
			if err := s.cp.put(e); err != nil {
				return nil, err
			}
		}
		return s.result(conf.CNIVersion, e)
	}
	t0 := time.Now()
	ns, name, uid := req.Args["K8S_POD_NAMESPACE"], req.Args["K8S_POD_NAME"], req.Args["K8S_POD_UID"]
	if ns == "" || name == "" {
		return nil, cniErr(errInvalidConfig, "CNI_ARGS lack K8S_POD_NAMESPACE/K8S_POD_NAME")
	}
	// The pod is bound to this node, so the node's pod cache knows it; the
	// API server is asked only when the cache lags behind.
	var pod corev1.Pod
	key := types.NamespacedName{Namespace: ns, Name: name}
	if err := s.client.Get(ctx, key, &pod); err != nil || (uid != "" && string(pod.UID) != uid) {
		if err := s.reader.Get(ctx, key, &pod); err != nil {
			return nil, cniErr(errTryAgainLater, "get pod %s/%s: %v", ns, name, err)
		}
	}
	if uid != "" && string(pod.UID) != uid {
		return nil, cniErr(errTryAgainLater, "pod %s/%s has UID %s, the runtime asked for %s", ns, name, pod.UID, uid)
	}
	var nsObj corev1.Namespace
	if err := s.client.Get(ctx, types.NamespacedName{Name: ns}, &nsObj); err != nil {
		return nil, cniErr(errTryAgainLater, "get namespace %s: %v", ns, err)
	}
	var nbps lacev1.NetworkBindingPolicyList
	if err := s.client.List(ctx, &nbps); err != nil {
		return nil, cniErr(errTryAgainLater, "list binding policies: %v", err)
	}
	b, err := model.Bind(nbps.Items, lacev1.MatchKindPod, ns, name, pod.Labels, nsObj.Labels)
	if err != nil {
		s.recorder.Eventf(&pod, corev1.EventTypeWarning, "NoNetworkBinding", "%v", err)
		return nil, cniErr(errNoBinding, "%v", err)
	}
	var nw lacev1.Network
	if err := s.client.Get(ctx, types.NamespacedName{Name: b.Network}, &nw); err != nil {
		return nil, cniErr(errNetworkMissing, "pod %s/%s binds to network %s (policy %s), which does not exist", ns, name, b.Network, b.Policy)
	}
	var e Endpoint
	switch nw.Spec.Type {
	case lacev1.NetworkTypeL3:
		e, err = s.l3Endpoint(ctx, &req, &pod, &nw)
	case lacev1.NetworkTypeL2:
		e, err = s.l2Endpoint(ctx, &req, &pod, &nw)
	default:
		return nil, cniErr(errNetworkMissing, "pod %s/%s binds to %s network %s: only l3 and l2 networks attach pods", ns, name, nw.Spec.Type, nw.Name)
	}
	if err != nil {
		return nil, err
	}

	t1 := time.Now()
	t2 := t1
	mtu, err := s.podMTU(e.L2)
	var res podnet.Result
	if err == nil {
		spec := podnet.Spec{NodeNS: s.opts.NetNS, PodNS: netnsPath(&req), HostIf: e.HostIf, PodIf: req.IfName,
			MTU: mtu, Addrs: e.Addrs, Gateways: e.Gateways}
		if e.L2 {
			spec.L2, spec.PrefixBits = true, e.PrefixBits
			spec.PodMAC, _ = net.ParseMAC(e.PodMAC)
			spec.HostMAC, _ = net.ParseMAC(e.GatewayMAC)
		}
		res, err = s.node.SetupPod(spec)
	}
	if err == nil {
		// The interface exists: recorded Ready, it is the applier's to
		// program, and ADD returns once it has.
		e.HostIfIndex, e.HostMAC, e.PodMAC = res.HostIfIndex, res.HostMAC.String(), res.PodMAC.String()
		hooked := s.opts.HostCgroup != "" && s.sync.Attached()
		if hooked {
			// The node's socket hooks (attached) see the pod's
			// processes: with its namespace's cookie they take the
			// hairpin choice for it. Without, the pod hairpins per
			// packet (from the VIP).
			if c, cerr := s.node.PodNetNSCookie(netnsPath(&req)); cerr == nil {
				e.NetNSCookie = c
			} else {
				s.log.Info("pod hairpins per packet: no network namespace cookie", "pod", ns+"/"+name, "error", cerr)
			}
		}
		e.Ready = true
		if err = s.cp.put(e); err == nil {
			t2 = time.Now()
			err = s.sync.SyncPods(ctx)
		}
	}
	if err != nil {
		// Leave nothing half-made: the runtime will DEL and retry.
		_ = s.teardown(ctx, e)
		return nil, fmt.Errorf("attach pod %s/%s: %w", ns, name, err)
	}
	t3 := time.Now()
	// The record is written off the runtime's critical path; a failure is
	// repaired by the next reconcile.
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.writeNetworkEndpoint(ctx, &pod, e); err != nil {
			s.log.Info("write NetworkEndpoint failed", "pod", ns+"/"+name, "err", err)
		}
	}()
	s.log.Info("pod attached", "pod", ns+"/"+name, "network", nw.Name, "addrs", e.Addrs,
		"api", t1.Sub(t0).String(), "interface", t2.Sub(t1).String(), "datapath", t3.Sub(t2).String(), "total", time.Since(t0).String())
	return s.result(conf.CNIVersion, e)
}

// l3Endpoint makes the endpoint record of pod in l3 network nw: an
// address per block of the network on this node, reserved in the
// checkpoint before any kernel change.
func (s *Server) l3Endpoint(ctx context.Context, req *cniapi.Request, pod *corev1.Pod, nw *lacev1.Network) (Endpoint, error) {
	blocks, err := s.waitBlocks(ctx, nw.Name)
	if err != nil {
		return Endpoint{}, err
	}
	e := Endpoint{ContainerID: req.ContainerID, IfName: req.IfName, NetNS: req.NetNS, PodNS: pod.Namespace, PodName: pod.Name,
		PodUID: string(pod.UID), Network: nw.Name, NetID: blocks[0].NetID, HostIf: podnet.HostIfName(req.ContainerID)}
	// Reserve the addresses in the checkpoint before touching the kernel.
	// Addresses in use on the node by any network, and the node's own, are
	// skipped: the node reaches each pod by its address alone.
	s.addLock.Lock()
	used := s.cp.used()
	for _, ad := range s.sync.OwnAddrs() {
		used[ad] = true
	}
	for _, bl := range blocks {
		ad, ok := pickAddr(bl.Prefix, used)
		if !ok {
			s.addLock.Unlock()
			s.recorder.Eventf(pod, corev1.EventTypeWarning, "NoFreeAddress", "network %s has no free address on node %s (block %s)", nw.Name, s.opts.NodeName, bl.Prefix)
			return Endpoint{}, cniErr(errNoAddress, "network %s has no free address on node %s", nw.Name, s.opts.NodeName)
		}
		e.Addrs = append(e.Addrs, ad)
		e.Gateways = append(e.Gateways, gateway(bl.Prefix))
	}
	wait := s.cp.reserve(e)
	s.addLock.Unlock()
	return e, wait()
}

// encapOverhead is what SRv6 reduced encapsulation adds to a pod's packet:
// the outer IPv6 header.
const encapOverhead = 40

// podMTU is the MTU of a new pod interface: --mtu when set, otherwise the
// underlay interface's MTU now less the encapsulation, so a pod's
// full-sized packet still fits the underlay once encapsulated (read at each
// ADD: a node whose fabric MTU changed gives new pods the new value). An
// l2 port's is l2Overhead less: its Ethernet header crosses the fabric
// too (1446 on a 1500 underlay; --mtu, the l3 pods' MTU, less 14).
func (s *Server) podMTU(l2 bool) (int, error) {
	extra := 0
	if l2 {
		extra = l2Overhead
	}
	if s.opts.MTU > 0 {
		if s.opts.MTU-extra < 1280 {
			return 0, cniErr(errInvalidConfig, "--mtu %d leaves l2 ports %d, below IPv6's minimum of 1280", s.opts.MTU, s.opts.MTU-extra)
		}
		return s.opts.MTU - extra, nil
	}
	m, err := s.node.UnderlayMTU()
	if err != nil {
		return 0, fmt.Errorf("underlay MTU: %w", err)
	}
	if m-encapOverhead-extra < 1280 {
		return 0, cniErr(errInvalidConfig, "underlay interface %s has MTU %d: pods would get %d, below IPv6's minimum of 1280",
			s.opts.UnderlayInterface, m, m-encapOverhead-extra)
	}
	return m - encapOverhead - extra, nil
}

// waitBlocks returns this node's blocks of network, waiting briefly for the
// controller to allocate them (a new node or network).
func (s *Server) waitBlocks(ctx context.Context, network string) ([]model.Block, error) {
	deadline := time.Now().Add(15 * time.Second)
	for {
		var out []model.Block
		for _, b := range s.sync.State().Blocks {
			if b.Network == network {
				out = append(out, b)
			}
		}
		if len(out) > 0 {
			return out, nil
		}
		if time.Now().After(deadline) {
			return nil, cniErr(errTryAgainLater, "network %s has no block on node %s yet (no Allocation)", network, s.opts.NodeName)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if err := s.sync.Refresh(ctx); err != nil {
			s.log.Info("reconcile while waiting for blocks", "err", err)
		}
	}
}

// networkEndpointSpec is what the NetworkEndpoint of e says.
func (s *Server) networkEndpointSpec(e Endpoint) lacev1.NetworkEndpointSpec {
	addrs := make([]lacev1.IPAddress, 0, len(e.Addrs))
	for _, ad := range e.Addrs {
		addrs = append(addrs, lacev1.IPAddress(ad.String()))
	}
	return lacev1.NetworkEndpointSpec{Network: e.Network, Node: s.opts.NodeName, Addresses: addrs,
		MAC: lacev1.MACAddress(e.PodMAC), Interface: e.IfName}
}

// errNetworkEndpointTaken: a pod's NetworkEndpoint name holds another
// node's object (a squatter, or the stale record of a namesake pod).
var errNetworkEndpointTaken = errors.New("NetworkEndpoint taken by another node")

func (s *Server) writeNetworkEndpoint(ctx context.Context, pod *corev1.Pod, e Endpoint) error {
	ne := &lacev1.NetworkEndpoint{}
	ne.Namespace, ne.Name = pod.Namespace, pod.Name
	spec := s.networkEndpointSpec(e)
	err := s.client.Get(ctx, client.ObjectKeyFromObject(ne), ne)
	if apierrors.IsNotFound(err) {
		ne.Labels = map[string]string{lacev1.LabelPodUID: string(pod.UID), lacev1.LabelNetwork: e.Network, lacev1.LabelNode: s.opts.NodeName}
		ne.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID,
			Controller: ptr.To(true)}}
		ne.Spec = spec
		return s.client.Create(ctx, ne)
	}
	if err != nil {
		return err
	}
	if ne.Spec.Node != s.opts.NodeName || ne.Labels[lacev1.LabelNode] != s.opts.NodeName {
		// Another node's object under this pod's name: this agent may not
		// touch it (the admission policy refuses), and consumers ignore it
		// for a pod that is not on that node; lace-controller deletes it.
		// Say so on the pod rather than only in this log.
		s.recorder.Eventf(pod, corev1.EventTypeWarning, "NetworkEndpointTaken",
			"NetworkEndpoint %s/%s is held by node %q, not %s (the pod's node): left to lace-controller to remove",
			ne.Namespace, ne.Name, ne.Spec.Node, s.opts.NodeName)
		return fmt.Errorf("NetworkEndpoint %s/%s is held by node %q: %w", ne.Namespace, ne.Name, ne.Spec.Node, errNetworkEndpointTaken)
	}
	owner := metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID, Controller: ptr.To(true)}
	if ne.Labels[lacev1.LabelPodUID] == string(pod.UID) && ne.Labels[lacev1.LabelNetwork] == e.Network &&
		ne.Labels[lacev1.LabelNode] == s.opts.NodeName && len(ne.OwnerReferences) == 1 &&
		ne.OwnerReferences[0].UID == owner.UID && ne.OwnerReferences[0].Name == owner.Name && equalSpec(ne.Spec, spec) {
		return nil // as it should be: an idle cluster sees no write
	}
	if ne.Labels == nil {
		ne.Labels = map[string]string{}
	}
	ne.Labels[lacev1.LabelPodUID] = string(pod.UID)
	ne.Labels[lacev1.LabelNetwork], ne.Labels[lacev1.LabelNode] = e.Network, s.opts.NodeName
	ne.OwnerReferences = []metav1.OwnerReference{owner}
	if ne.Spec.Network == spec.Network {
		// The port's learned bindings and activation stay (learn.go,
		// migrate.go).
		spec.Learned, spec.Activated = ne.Spec.Learned, ne.Spec.Activated
	}
	ne.Spec = spec
	return s.client.Update(ctx, ne)
}

func (s *Server) result(version string, e Endpoint) (json.RawMessage, error) {
	if version == "" {
		version = "1.1.0"
	}
	hm, _ := net.ParseMAC(e.HostMAC)
	pm, _ := net.ParseMAC(e.PodMAC)
	r := &types100.Result{CNIVersion: types100.ImplementedSpecVersion}
	r.Interfaces = []*types100.Interface{
		{Name: e.HostIf, Mac: hm.String()},
		{Name: e.IfName, Mac: pm.String(), Sandbox: e.NetNS},
	}
	for i, ad := range e.Addrs {
		gw := e.Gateways[i]
		bits := ad.BitLen()
		if i < len(e.PrefixBits) {
			bits = e.PrefixBits[i] // an l2 pod's subnet is on-link
		}
		r.IPs = append(r.IPs, &types100.IPConfig{Interface: ptr.To(1), Address: toIPNet(netip.PrefixFrom(ad, bits)), Gateway: gw.AsSlice()})
		def := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
		if ad.Is6() {
			def = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
		}
		r.Routes = append(r.Routes, &cnitypes.Route{Dst: toIPNet(def), GW: gw.AsSlice()})
	}
	conv, err := r.GetAsVersion(version)
	if err != nil {
		return nil, cniErr(1, "CNI version %s: %v", version, err)
	}
	b, err := json.Marshal(conv)
	return b, err
}

func toIPNet(p netip.Prefix) net.IPNet {
	return net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// cmdDel removes the endpoint of a container. Unknown containers and
// already-removed pieces are success, as the CNI spec asks.
func (s *Server) cmdDel(ctx context.Context, req cniapi.Request) error {
	e, ok := s.cp.get(req.ContainerID)
	if !ok {
		// Nothing recorded: remove a host interface of that name, if any.
		hostIf := podnet.HostIfName(req.ContainerID)
		return errors.Join(s.dp.DetachPod(hostIf), s.node.TeardownPod(hostIf, nil))
	}
	if err := s.teardown(ctx, e); err != nil {
		return err
	}
	s.log.Info("pod detached", "pod", e.PodNS+"/"+e.PodName, "addrs", e.Addrs)
	return nil
}

func (s *Server) cmdCheck(req cniapi.Request) error {
	e, ok := s.cp.get(req.ContainerID)
	if !ok || !e.Ready {
		return cniErr(errTryAgainLater, "container %s has no Lace endpoint on node %s", req.ContainerID, s.opts.NodeName)
	}
	eps, err := s.dp.Endpoints()
	if err != nil {
		return err
	}
	for _, ad := range e.Addrs {
		found := false
		for _, x := range eps {
			found = found || (x.NetID == e.NetID && x.Addr == ad)
		}
		if !found {
			return cniErr(errTryAgainLater, "address %s of container %s is not in the data plane", ad, req.ContainerID)
		}
	}
	return nil
}

// cmdGC removes every endpoint whose attachment the runtime no longer
// lists (CNI 1.1 GC).
func (s *Server) cmdGC(ctx context.Context, req cniapi.Request) error {
	var conf struct {
		Valid []struct {
			ContainerID string `json:"containerID"`
			IfName      string `json:"ifname"`
		} `json:"cni.dev/valid-attachments"`
	}
	if err := json.Unmarshal(req.Config, &conf); err != nil {
		return cniErr(errInvalidConfig, "parse GC config: %v", err)
	}
	// By host interface, the hash of the container ID: an endpoint rebuilt
	// without its container ID is matched too.
	valid := map[string]bool{}
	for _, v := range conf.Valid {
		valid[podnet.HostIfName(v.ContainerID)] = true
	}
	var errs []error
	for _, e := range s.cp.all() {
		if !valid[e.HostIf] {
			s.log.Info("GC removes stale endpoint", "container", e.ContainerID, "pod", e.PodNS+"/"+e.PodName)
			errs = append(errs, s.teardown(ctx, e))
		}
	}
	return errors.Join(errs...)
}

// netnsPath is where the agent opens the pod's network namespace. The
// runtime names it by a path in its own mount namespace, which the agent,
// running in a container, does not share: through the calling plugin's
// /proc/<pid>/root the path resolves as the runtime sees it (the agent
// shares the host's PID namespace). Without a plugin PID, or when that
// path does not exist, the path is taken as it is (an agent running beside
// the runtime).
func netnsPath(req *cniapi.Request) string {
	if req.PluginPID > 0 && filepath.IsAbs(req.NetNS) {
		p := fmt.Sprintf("/proc/%d/root%s", req.PluginPID, req.NetNS)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return req.NetNS
}
