package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
)

// bigUDP is larger than any MTU of the lab (pods, nodes, the external
// host): every datagram leaves its sender in fragments.
const bigUDP = 8192

// bigUDPEcho answers every datagram to addr (both families on "[::]:port")
// in the namespace at nsPath with the same bytes, whatever their size.
func bigUDPEcho(t *testing.T, nsPath string, port uint16) {
	t.Helper()
	udpEchoServer(t, nsPath, netip.AddrPortFrom(netip.IPv6Unspecified(), port))
}

// bigExchange sends one bigUDP-byte datagram from the namespace at ns to
// dst and waits for all of it back (asking again up to three times).
func bigExchange(ns string, dst netip.AddrPort) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := netutil.DialContext(ctx, ns, "udp", dst.String())
	if err != nil {
		return err
	}
	defer c.Close()
	req := make([]byte, bigUDP)
	_, _ = rand.Read(req)
	buf := make([]byte, 65536)
	for range 3 {
		if _, err := c.Write(req); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		n, err := c.Read(buf)
		if err != nil {
			continue
		}
		if !bytes.Equal(buf[:n], req) {
			return fmt.Errorf("%s answered %d bytes, not the %d sent", dst, n, len(req))
		}
		return nil
	}
	return fmt.Errorf("no answer of %d bytes from %s", bigUDP, dst)
}

// TestLargeUDPThroughTranslations: 8 KB UDP datagrams (fragmented by
// their senders) are echoed in full, both families, through every path:
// pod to pod across nodes (SRv6), to a ClusterIP from the endpoint's node
// and from another, to a NodePort from the external host (endpoint on the
// node entered and elsewhere), and to the external host through SNAT.
// Before frag.h the later fragments were dropped (IPv4) or missed the
// translation (IPv6).
func TestLargeUDPThroughTranslations(t *testing.T) {
	needLab(t)
	pods := semStart(t, semPod("frag-srv", "frag", "n2"), semPod("frag-cl1", "frag-client", "n1"), semPod("frag-cl2", "frag-client", "n2"))
	const bigPort = 9300
	srvNS := podNetNS(t, pods["frag-srv"])
	bigUDPEcho(t, srvNS, bigPort)
	ext := externalNS()
	bigUDPEcho(t, ext, bigPort)
	svc := semService(t, "frag", "frag", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "big", Port: 82, TargetPort: intstr.FromInt32(bigPort), Protocol: corev1.ProtocolUDP})
	})
	var nodePort uint16
	for _, p := range svc.Spec.Ports {
		if p.Name == "big" {
			nodePort = uint16(p.NodePort)
		}
	}
	if nodePort == 0 {
		t.Fatalf("service frag has no NodePort for big: %+v", svc.Spec.Ports)
	}
	waitEndpoints(t, svc, 1)
	cl1, cl2 := podNetNS(t, pods["frag-cl1"]), podNetNS(t, pods["frag-cl2"])
	srv4, srv6 := podAddrs(pods["frag-srv"])
	extV4, extV6 := lab.ExternalUnderlay()

	type path struct {
		what string
		ns   string
		dst  netip.AddrPort
	}
	var paths []path
	for _, v4 := range []bool{true, false} {
		srv, extA := srv6, extV6
		if v4 {
			srv, extA = srv4, extV4
		}
		var vip netip.Addr
		for _, a := range clusterIPs(svc) {
			if a.Is4() == v4 {
				vip = a
			}
		}
		paths = append(paths,
			path{"pod to pod across nodes", cl1, netip.AddrPortFrom(srv, bigPort)},
			path{"ClusterIP, endpoint on another node", cl1, netip.AddrPortFrom(vip, 82)},
			path{"ClusterIP, endpoint on the client's node", cl2, netip.AddrPortFrom(vip, 82)},
			path{"NodePort from outside, endpoint elsewhere", ext, netip.AddrPortFrom(nodeAddr(1, v4), nodePort)},
			path{"NodePort from outside, endpoint on the node", ext, netip.AddrPortFrom(nodeAddr(2, v4), nodePort)},
			path{"SNAT to the external host", cl1, netip.AddrPortFrom(extA, bigPort)},
		)
	}
	for _, p := range paths {
		t.Run(fmt.Sprintf("%s %s", p.what, p.dst), func(t *testing.T) {
			eventually(t, 30*time.Second, fmt.Sprintf("%d-byte UDP to %s (%s) echoed in full", bigUDP, p.dst, p.what), func() error {
				return bigExchange(p.ns, p.dst)
			})
			// Converged: every exchange now works, not one in a few.
			for i := range 5 {
				if err := bigExchange(p.ns, p.dst); err != nil {
					t.Fatalf("exchange %d after the first: %v", i, err)
				}
			}
		})
	}
}

// TestLargeUDPFromNodeSockets: a node's own socket (a hostNetwork pod's
// process, in the node's cgroup) sends 8 KB UDP datagrams to a ClusterIP,
// both families, whose endpoint is on the same node and on another; the
// socket hooks translate before the datagram is fragmented, and the
// answer comes back from the VIP (reassembled, so whole).
func TestLargeUDPFromNodeSockets(t *testing.T) {
	needLab(t)
	ctx := context.Background()
	const bigPort = 9300
	hn := netexecPod("frag-hostnet", "n1")
	hn.Spec.HostNetwork = true
	hn.Spec.Containers[0].Args = []string{"netexec", "--http-port=18190", "--udp-port=18191"}
	hn.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 18190}}
	pods := semStart(t, semPod("frag-n-local", "frag-n-local", "n1"), semPod("frag-n-remote", "frag-n-remote", "n2"), hn)
	msg := "echo " + strings.Repeat("x", bigUDP)
	for _, where := range []string{"local", "remote"} {
		bigUDPEcho(t, podNetNS(t, pods["frag-n-"+where]), bigPort)
		svc := semService(t, "frag-n-"+where, "frag-n-"+where, func(s *corev1.Service) {
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "big", Port: 82, TargetPort: intstr.FromInt32(bigPort), Protocol: corev1.ProtocolUDP})
		})
		waitEndpoints(t, svc, 1)
		for _, vip := range clusterIPs(svc) {
			eventually(t, 30*time.Second, fmt.Sprintf("node socket -> %s:82 (endpoint %s): %d-byte datagram echoed in full", vip, where, len(msg)), func() error {
				q := url.Values{"host": {vip.String()}, "port": {"82"}, "request": {msg}, "protocol": {"udp"}, "tries": {"1"}}
				body, err := getFromNode(ctx, "n2", "http://"+pods["frag-hostnet"].Status.HostIP+":18190/dial?"+q.Encode())
				if err != nil {
					return err
				}
				var r struct {
					Responses []string `json:"responses"`
					Errors    []string `json:"errors"`
				}
				if err := json.Unmarshal(body, &r); err != nil {
					return fmt.Errorf("dial answered %.200s (%v)", body, err)
				}
				// netexec reads the first 2048 bytes of the answer: a
				// datagram is reassembled whole or not at all, so any of
				// it means all of both crossed.
				if len(r.Responses) != 1 || len(r.Responses[0]) < 2048 || !strings.HasPrefix(msg, r.Responses[0]) {
					return fmt.Errorf("answered %.40q..., errors %v; want the start of the %d bytes sent", r.Responses, r.Errors, len(msg))
				}
				return nil
			})
		}
	}
}
