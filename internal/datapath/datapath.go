// Package datapath owns Lace's eBPF data plane on one node: loading the
// programs compiled from ../../bpf, pinning their maps and links under a
// bpffs directory so that an agent restart keeps forwarding, attaching them
// with tcx, and typed access to every map. It knows nothing of Kubernetes
// (it must not import k8s.io/api): callers translate API objects into the
// types of this package.
//
// Every map written from a desired state goes through one table
// reconciler (reconcile.go, the tables in nodetables.go): an in-memory
// mirror of what was written, so syncs never read the kernel, and a
// periodic CheckTables that repairs drift. Maps the programs write
// themselves (conntrack, SNAT, affinity, fragments, reverse NAT, budgets
// and counters) are state, never reconciled against a desired state.
package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/internal/tables"
)

// The table values and the SID layout are package tables' (pure, shared
// with the model); these names keep the datapath's API in one place.
const (
	BehaviourL3Decap = tables.BehaviourL3Decap
	BehaviourL2IP    = tables.BehaviourL2IP
	BehaviourL2Flood = tables.BehaviourL2Flood
)

// SID returns the SID of behaviour inside locator (a /64) for a packet of
// network srcNet to network dstNet.
func SID(locator netip.Prefix, behaviour uint8, srcNet, dstNet uint32) netip.Addr {
	return tables.SID(locator, behaviour, srcNet, dstNet)
}

// Datapath is the loaded programs and pinned maps of one node.
type Datapath struct {
	mu       sync.Mutex
	podNS    string // the node's network namespace, where pods' interfaces are
	pinDir   string
	pod      podObjects
	underlay underlayObjects
	sock     sockObjects
	l2       l2Objects
	// replacedMaps are the pinned maps Load migrated or recreated.
	replacedMaps []string
	// programmed is lace_services as the agent found it at load
	// (ProgrammedFrontends).
	programmed map[ServiceKey]ProgrammedFrontend
	// tab writes the maps the agent programs (nodetables.go).
	tab *nodeTables
	// ctWalk is the flush's conntrack walk buffers (FlushServiceFlows).
	ctWalk walkBuf[podCtKey, podCtVal]
	// affWalk is the affinity map's, walked when a service with affinity
	// loses endpoints.
	affWalk walkBuf[podAffinityKey, podAffinityVal]
}

func verifierDetail(err error) error {
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) {
		return fmt.Errorf("%+v", ve)
	}
	return err
}

// Close releases this process's handles. Pinned maps and links stay, so
// forwarding continues without the agent.
func (d *Datapath) Close() error {
	return errors.Join(d.pod.Close(), d.underlay.Close(), d.sock.Close(), d.l2.Close())
}

// Remove unpins every map and link (the node leaves Lace); programs detach
// once nothing holds them.
func (d *Datapath) Remove() error {
	_ = d.Close()
	return os.RemoveAll(d.pinDir)
}

// Direction of a tcx attachment.
type Direction int

// Directions.
const (
	Ingress Direction = iota
	Egress
)

func (dir Direction) String() string {
	if dir == Egress {
		return "egress"
	}
	return "ingress"
}

func (d *Datapath) linkPin(ifName string, dir Direction) string {
	return filepath.Join(d.pinDir, "links", ifName+"-"+dir.String())
}

// attach attaches prog to ifName (in the namespace nsPath) with tcx and pins
// the link. An existing pinned link is updated to prog instead, so a new
// agent replaces its programs without a gap.
func (d *Datapath) attach(nsPath, ifName string, dir Direction, prog *ebpf.Program) error {
	pin := d.linkPin(ifName, dir)
	if l, err := link.LoadPinnedLink(pin, nil); err == nil {
		defer l.Close()
		if err := l.Update(prog); err == nil {
			return nil
		}
		// The interface went away (and the link with it): attach afresh.
		_ = l.Unpin()
	}
	attachType := ebpf.AttachTCXIngress
	if dir == Egress {
		attachType = ebpf.AttachTCXEgress
	}
	return netutil.Do(nsPath, func() error {
		iface, err := net.InterfaceByName(ifName)
		if err != nil {
			return fmt.Errorf("find %s: %w", ifName, err)
		}
		l, err := link.AttachTCX(link.TCXOptions{Interface: iface.Index, Program: prog, Attach: attachType})
		if err != nil {
			return fmt.Errorf("attach tcx %s %s: %w", dir, ifName, err)
		}
		defer l.Close()
		if err := l.Pin(pin); err != nil {
			return fmt.Errorf("pin link of %s: %w", ifName, err)
		}
		return nil
	})
}

// AttachPod attaches from_pod to the ingress of the host side of a pod's
// veth (what the pod sends) and to_pod to its egress, which sees only what
// the node's own stack sends the pod (bpf_redirect_peer skips it). Both
// are classic tc filters, not tcx: a tcx attach makes the pod's ADD wait
// for an RCU grace period each (netutil.ReplaceFilter). to_pod goes first,
// so no answer of the node's stack passes untranslated once the pod can
// send. The program pinned again in the links directory records the
// attachment, as a pinned link does for tcx.
//
// A port of an l2 network (l2) takes from_l2 at ingress instead, which
// switches its frames and hands from_pod those to the gateway.
func (d *Datapath) AttachPod(nsPath, hostIf string, l2 bool) error {
	if err := netutil.ReplaceFilter(nsPath, hostIf, false, d.pod.ToPod.FD(), "lace-to-pod"); err != nil {
		return err
	}
	in, name := d.pod.FromPod, "lace-from-pod"
	if l2 {
		in, name = d.l2.FromL2, "lace-from-l2"
	}
	if err := netutil.ReplaceFilter(nsPath, hostIf, true, in.FD(), name); err != nil {
		return err
	}
	d.mu.Lock()
	d.podNS = nsPath
	d.mu.Unlock()
	// A clone: pinning the loaded program itself would move its one pin.
	marker, err := d.pod.FromPod.Clone()
	if err != nil {
		return fmt.Errorf("record attachment of %s: %w", hostIf, err)
	}
	defer marker.Close()
	if err := marker.Pin(d.tcMarker(hostIf)); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("record attachment of %s: %w", hostIf, err)
	}
	// An agent before this one attached with tcx: that link goes now that
	// the filter runs (tcx would run first).
	return d.unpinLinks(hostIf)
}

func (d *Datapath) tcMarker(hostIf string) string {
	return filepath.Join(d.pinDir, "links", hostIf+tcSuffix)
}

const tcSuffix = "-tc"

// unpinLinks removes hostIf's pinned tcx links, which detaches them.
func (d *Datapath) unpinLinks(hostIf string) error {
	var errs []error
	for _, dir := range []Direction{Ingress, Egress} {
		l, err := link.LoadPinnedLink(d.linkPin(hostIf, dir), nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, l.Unpin(), l.Close())
	}
	return errors.Join(errs...)
}

// DetachPod removes the pod programs of hostIf. A missing interface or
// attachment is fine.
func (d *Datapath) DetachPod(hostIf string) error {
	errs := []error{d.unpinLinks(hostIf)}
	marker := d.tcMarker(hostIf)
	if _, err := os.Stat(marker); err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	}
	// The filters go with the interface; one that stays (a leftover no
	// endpoint claims) loses them here. Before this agent attached
	// anything it does not know the node's namespace: the interface's
	// programs then drop everything (no port), until it goes.
	d.mu.Lock()
	nsPath := d.podNS
	d.mu.Unlock()
	if nsPath != "" {
		if err := netutil.RemoveFilters(nsPath, hostIf); err != nil {
			return errors.Join(append(errs, err)...)
		}
	}
	errs = append(errs, os.Remove(marker))
	return errors.Join(errs...)
}

// AttachUnderlay attaches from_underlay to the ingress of the node's
// underlay interface, and to_underlay to its egress (only Lace's own
// encapsulation reaches other nodes' locators; nothing leaves from another
// node's address). Egress first: once the node takes SRv6 in, nothing
// forged leaves it.
func (d *Datapath) AttachUnderlay(nsPath, ifName string) error {
	d.mu.Lock()
	d.podNS = nsPath
	d.mu.Unlock()
	if err := d.attach(nsPath, ifName, Egress, d.underlay.ToUnderlay); err != nil {
		return err
	}
	return d.attach(nsPath, ifName, Ingress, d.underlay.FromUnderlay)
}

// AttachHostSockets attaches the connect-time service translation to the
// cgroup v2 directory cgroupPath (the node's processes and pods below it;
// the programs translate sockets of the host network namespace, whose
// cookie SetConfig records, and take the hairpin choice for pods whose
// port carries their namespace's cookie). Links are pinned and updated in
// place, like the tcx ones.
func (d *Datapath) AttachHostSockets(cgroupPath string) error {
	for _, a := range []struct {
		name string
		prog *ebpf.Program
		typ  ebpf.AttachType
	}{
		{"connect4", d.sock.SockConnect4, ebpf.AttachCGroupInet4Connect},
		{"connect6", d.sock.SockConnect6, ebpf.AttachCGroupInet6Connect},
		{"sendmsg4", d.sock.SockSendmsg4, ebpf.AttachCGroupUDP4Sendmsg},
		{"sendmsg6", d.sock.SockSendmsg6, ebpf.AttachCGroupUDP6Sendmsg},
		{"recvmsg4", d.sock.SockRecvmsg4, ebpf.AttachCGroupUDP4Recvmsg},
		{"recvmsg6", d.sock.SockRecvmsg6, ebpf.AttachCGroupUDP6Recvmsg},
		{"getpeername4", d.sock.SockGetpeername4, ebpf.AttachCgroupInet4GetPeername},
		{"getpeername6", d.sock.SockGetpeername6, ebpf.AttachCgroupInet6GetPeername},
	} {
		pin := filepath.Join(d.pinDir, "links", "cgroup-"+a.name)
		if l, err := link.LoadPinnedLink(pin, nil); err == nil {
			err = l.Update(a.prog)
			l.Close()
			if err == nil {
				continue
			}
			_ = os.Remove(pin)
		}
		l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroupPath, Attach: a.typ, Program: a.prog})
		if err != nil {
			return fmt.Errorf("attach %s to cgroup %s: %w", a.name, cgroupPath, err)
		}
		err = l.Pin(pin)
		l.Close()
		if err != nil {
			return fmt.Errorf("pin %s link: %w", a.name, err)
		}
	}
	return nil
}

// NetNSCookie is the cookie of the network namespace at nsPath (what
// bpf_get_netns_cookie answers for its sockets).
func NetNSCookie(nsPath string) (uint64, error) {
	var cookie uint64
	err := netutil.Do(nsPath, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		v, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		cookie = v
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("network namespace cookie of %s: %w", nsPath, err)
	}
	return cookie, nil
}

// PinnedPodLinks lists the host interfaces with pod programs attached
// (tc markers, or pinned tcx links of an earlier agent).
func (d *Datapath) PinnedPodLinks() ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(d.pinDir, "links"))
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []string
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), "-"+Ingress.String())
		if !ok {
			name, ok = strings.CutSuffix(e.Name(), "-"+Egress.String())
		}
		if !ok {
			name, ok = strings.CutSuffix(e.Name(), tcSuffix)
		}
		if ok && !seen[name] && strings.HasPrefix(name, PodIfPrefix) {
			seen[name] = true
			out = append(out, name)
		}
	}
	return out, nil
}

// PodIfPrefix starts the name of every pod's host-side interface.
const PodIfPrefix = "lace"
