package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
)

// result of one path: throughput and request/response latency.
type result struct {
	gbps          float64
	p50, p99      time.Duration
	transactionsS float64
}

func labClient(name string) (kubernetes.Interface, lab.Config, error) {
	cfg, c, err := labRESTConfig(name)
	if err != nil {
		return nil, c, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	return cs, c, err
}

// labRESTConfig is the client configuration of lab name, and the lab's.
func labRESTConfig(name string) (*rest.Config, lab.Config, error) {
	c := lab.DefaultConfig()
	c.Name = name
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig())
	return cfg, c, err
}

// benchForwarding measures pod-to-pod paths of the lab beside their
// kernel-routed twin (see twin) and, when peerLab is not "", the same
// paths of a flannel lab (flannel vxlan, kube-proxy nftables), all in the
// same run.
func benchForwarding(ctx context.Context, name, peerLab string, dur time.Duration) error {
	pods, cleanupPods, err := forwardingPods(ctx, name)
	defer cleanupPods()
	if err != nil {
		return err
	}
	var peer map[string]benchPod
	if peerLab != "" {
		var cleanupPeer func()
		peer, cleanupPeer, err = forwardingPods(ctx, peerLab)
		defer cleanupPeer()
		if err != nil {
			return fmt.Errorf("flannel lab %s: %w", peerLab, err)
		}
	}

	// The twin's pods get the MTU Lace gave its pods, so both carry the
	// same segments.
	mtu, err := linkMTU(pods["bench-a"].ns, "eth0")
	if err != nil {
		return fmt.Errorf("lace pod mtu: %w", err)
	}
	flMTU := 0
	if peerLab != "" {
		if flMTU, err = linkMTU(peer["bench-a"].ns, "eth0"); err != nil {
			return fmt.Errorf("flannel pod mtu: %w", err)
		}
	}
	tw, cleanup, err := buildTwin(name+"-twin", mtu)
	if err != nil {
		return err
	}
	defer cleanup()
	pairSrc, pairDst, pairAddr, cleanupPair, err := vethPair(name + "-pair")
	if err != nil {
		return err
	}
	defer cleanupPair()

	// The paths take turns, rounds times, starting each round one path
	// further, so that drift on a busy machine hits each of them alike;
	// each reports its median round.
	type path struct {
		name     string
		src, dst string
		addr     netip.Addr
	}
	paths := []path{
		{"Lace same node", pods["bench-a"].ns, pods["bench-b"].ns, pods["bench-b"].ip},
		{"Lace across nodes", pods["bench-a"].ns, pods["bench-c"].ns, pods["bench-c"].ip},
		{"twin same node", tw.a, tw.b, tw.bAddr},
		{"twin across nodes", tw.a, tw.c, tw.cAddr},
		{"veth pair", pairSrc, pairDst, pairAddr},
	}
	if peerLab != "" {
		paths = append(paths,
			path{"flannel same node", peer["bench-a"].ns, peer["bench-b"].ns, peer["bench-b"].ip},
			path{"flannel across nodes", peer["bench-a"].ns, peer["bench-c"].ns, peer["bench-c"].ip})
	}
	// One short exchange per path first: neighbours get resolved and
	// nothing is cold when the first round starts.
	for _, p := range paths {
		if _, _, _, err := requestResponse(ctx, p.src, p.dst, p.addr, 200*time.Millisecond); err != nil {
			return fmt.Errorf("%s: warm-up: %w", p.name, err)
		}
	}
	samples := make([][]result, len(paths))
	for round := range rounds {
		// Every path of a round runs on the same CPU, the next round on
		// the next CPU (see iperf).
		cpu := round % max(runtime.NumCPU(), 1)
		for k := range paths {
			i := (k + round) % len(paths)
			p := paths[i]
			r, err := measurePath(ctx, p.src, p.dst, p.addr, dur, cpu)
			if err != nil {
				return fmt.Errorf("%s: %w", p.name, err)
			}
			samples[i] = append(samples[i], r)
		}
	}
	m := make([]result, len(paths))
	for i := range paths {
		m[i] = median(samples[i])
	}
	type row struct {
		name, peerName string
		lace, peer     result
	}
	var rows []row
	if peerLab != "" {
		rows = append(rows,
			row{"pod to pod, same node", "flannel, same node (bridge)", m[0], m[5]},
			row{"pod to pod, across nodes (SRv6)", "flannel, across nodes (vxlan)", m[1], m[6]})
	}
	rows = append(rows, []row{
		{"pod to pod, same node", "same node, kernel routing", m[0], m[2]},
		{"pod to pod, across nodes (SRv6)", "across nodes, kernel routing", m[1], m[3]},
		// Not a peer: one veth pair is not the path of any pod (no node,
		// no fabric); the row only links to the figures of earlier runs.
		{"reference only: across nodes", "one veth pair (not a peer)", m[1], m[4]},
	}...)

	fmt.Printf("Forwarding (IPv4, pod MTU %d; throughput = iperf3, one TCP stream, %s, sender and receiver on one CPU; request/response = 1-byte ping-pong on one connection, %s; median of %d interleaved rounds)\n",
		mtu, dur, dur, rounds)
	if peerLab != "" {
		fmt.Printf("peers: flannel = lab %s (flannel %s, vxlan, pod MTU %d; the same nodes, fabric and kernel); kernel routing = the same namespaces and links (pod veth, node, fabric bridge, node, pod veth) routed by the kernel without encapsulation\n",
			peerLab, lab.FlannelVersion, flMTU)
	} else {
		fmt.Println("peer = the same namespaces and links (pod veth, node, fabric bridge, node, pod veth) routed by the kernel without encapsulation")
	}
	tab := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tab, "Lace path\tpeer\tLace Gbit/s\tpeer Gbit/s\tratio\tLace p50\tpeer p50\tratio\tLace p99\tpeer p99\tratio\t")
	for _, r := range rows {
		fmt.Fprintf(tab, "%s\t%s\t%.2f\t%.2f\t%.2f\t%s\t%s\t%.2f\t%s\t%s\t%.2f\t\n", r.name, r.peerName,
			r.lace.gbps, r.peer.gbps, r.lace.gbps/r.peer.gbps,
			us(r.lace.p50), us(r.peer.p50), float64(r.lace.p50)/float64(r.peer.p50),
			us(r.lace.p99), us(r.peer.p99), float64(r.lace.p99)/float64(r.peer.p99))
	}
	tab.Flush()
	fmt.Println("throughput ratio = Lace / peer (higher is better); latency ratio = Lace / peer (lower is better)")
	fmt.Println("targets across nodes: against flannel, throughput ratio >= 1.2 and p50 ratio <= 0.8; against kernel routing, throughput ratio >= 0.95 and p50 ratio <= 1.10")
	fmt.Println()
	return nil
}

// forwardingPods starts the forwarding benchmark's pods on the lab name,
// bench-a and bench-b on n1 and bench-c on n2 (runPods); cleanup deletes
// them, also after an error.
func forwardingPods(ctx context.Context, name string) (pods map[string]benchPod, cleanup func(), err error) {
	cs, c, err := labClient(name)
	if err != nil {
		return nil, func() {}, err
	}
	nodes := map[string]string{"bench-a": "n1", "bench-b": "n1", "bench-c": "n2"}
	cleanup = func() {
		for p := range nodes {
			_ = cs.CoreV1().Pods("default").Delete(context.WithoutCancel(ctx), p, metav1.DeleteOptions{})
		}
	}
	pods, err = runPods(ctx, cs, c, "default", nodes)
	return pods, cleanup, err
}

// linkMTU returns the MTU of link name in the namespace at nsPath.
func linkMTU(nsPath, name string) (int, error) {
	var mtu int
	err := netutil.Do(nsPath, func() error {
		ifc, err := net.InterfaceByName(name)
		if err != nil {
			return err
		}
		mtu = ifc.MTU
		return nil
	})
	return mtu, err
}

// rounds is how many times each path is measured: five, because the
// machine is shared and one round in three or four is an outlier.
const rounds = 5

// median takes each figure's median over the rounds.
func median(rs []result) result {
	pick := func(f func(result) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	return result{
		gbps:          pick(func(r result) float64 { return r.gbps }),
		p50:           time.Duration(pick(func(r result) float64 { return float64(r.p50) })),
		p99:           time.Duration(pick(func(r result) float64 { return float64(r.p99) })),
		transactionsS: pick(func(r result) float64 { return r.transactionsS }),
	}
}

func us(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e3, 'f', 1, 64) + "µs" }

// measurePath runs a throughput test then a request/response test from
// namespace src to addr (served in namespace dst).
func measurePath(ctx context.Context, src, dst string, addr netip.Addr, dur time.Duration, cpu int) (result, error) {
	var r result
	var err error
	if r.gbps, err = iperf(ctx, src, dst, addr, dur, cpu); err != nil {
		return r, fmt.Errorf("iperf3: %w", err)
	}
	r.p50, r.p99, r.transactionsS, err = requestResponse(ctx, src, dst, addr, dur)
	if err != nil {
		return r, fmt.Errorf("request/response: %w", err)
	}
	return r, nil
}

// inNS is a command run in the network namespace at nsPath (nsenter keeps
// the caller's mount namespace, so the host's iperf3 runs in a pod's
// network namespace too).
func inNS(ctx context.Context, nsPath string, argv ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + nsPath, "--"}, argv...)...)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// iperfPort is where the iperf3 server of a path listens.
const iperfPort = "5202"

// iperf runs one iperf3 TCP stream of dur from src to addr, served by a
// one-off iperf3 server in dst, and returns what the server received in
// Gbit/s.
//
// Sender and receiver are pinned to one CPU. Both ends of every path share
// this machine's CPUs, and a veth delivers on the CPU that sends: when the
// sender's process and the softirq that handles the receiver's ACKs run on
// two CPUs, segments of the stream take two backlogs and arrive out of
// order, and the run measures spurious retransmissions and the scheduler
// (hundreds per second, throughput swinging by half between runs) rather
// than the path. On one CPU the whole path runs in order and the figure is
// the path's cost.
func iperf(ctx context.Context, src, dst string, addr netip.Addr, dur time.Duration, cpu int) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, dur+30*time.Second)
	defer cancel()
	srv := inNS(ctx, dst, "iperf3", "--server", "--one-off", "--forceflush", "--bind", addr.String(), "--port", iperfPort)
	out, err := srv.StdoutPipe()
	if err != nil {
		return 0, err
	}
	var srvErr bytes.Buffer
	srv.Stderr = &srvErr
	if err := srv.Start(); err != nil {
		return 0, fmt.Errorf("start server: %w", err)
	}
	defer func() {
		// The one-off server exits after its test; kill it if the client
		// failed before running one.
		_ = srv.Process.Kill()
		_ = srv.Wait()
	}()
	listening := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		ok := false
		for sc.Scan() {
			if !ok && strings.Contains(sc.Text(), "Server listening") {
				ok = true
				listening <- true
			}
		}
		if !ok {
			listening <- false
		}
	}()
	select {
	case ok := <-listening:
		if !ok {
			_ = srv.Wait() // stderr is complete once Wait returns
			return 0, fmt.Errorf("server did not listen: %s", strings.TrimSpace(srvErr.String()))
		}
	case <-ctx.Done():
		return 0, fmt.Errorf("server did not listen: %w", ctx.Err())
	}
	secs := int(dur.Round(time.Second) / time.Second)
	if secs < 1 {
		secs = 1
	}
	cli := inNS(ctx, src, "iperf3", "--client", addr.String(), "--port", iperfPort, "--parallel", "1",
		"--time", strconv.Itoa(secs), "--affinity", fmt.Sprintf("%d,%d", cpu, cpu), "--json")
	var stdout, stderr bytes.Buffer
	cli.Stdout, cli.Stderr = &stdout, &stderr
	runErr := cli.Run()
	var rep struct {
		Error string `json:"error"`
		End   struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		return 0, fmt.Errorf("client: %v: %s", errors.Join(runErr, err), strings.TrimSpace(stderr.String()))
	}
	if rep.Error != "" || runErr != nil {
		return 0, fmt.Errorf("client: %v: %s", runErr, rep.Error)
	}
	return rep.End.SumReceived.BitsPerSecond / 1e9, nil
}

// requestResponse sends one byte and waits for it back, over and over for
// dur on one connection from src to a server in dst, and returns the p50
// and p99 round trip and the transactions per second.
func requestResponse(ctx context.Context, src, dst string, addr netip.Addr, dur time.Duration) (p50, p99 time.Duration, perS float64, err error) {
	ap := net.JoinHostPort(addr.String(), "5201")
	return pingPongRTT(ctx, dst, ap, src, ap, dur)
}

// pingPongRTT runs a one-byte echo server listening on listen in the
// namespace srvNS and a client in cliNS dialing dial, for dur on one
// connection; the listen and dial addresses differ when the client goes
// through a VIP.
func pingPongRTT(ctx context.Context, srvNS, listen, cliNS, dial string, dur time.Duration) (p50, p99 time.Duration, perS float64, err error) {
	lat, perS, err := pingPongSamples(ctx, srvNS, listen, cliNS, dial, dur)
	if err != nil {
		return 0, 0, 0, err
	}
	return lat[len(lat)/2], lat[len(lat)*99/100], perS, nil
}

// pingPongSamples is pingPongRTT's every round trip, sorted.
func pingPongSamples(ctx context.Context, srvNS, listen, cliNS, dial string, dur time.Duration) (lat []time.Duration, perS float64, err error) {
	ln, err := netutil.Listen(srvNS, "tcp", listen)
	if err != nil {
		return nil, 0, err
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		b := make([]byte, 1)
		for {
			if _, err := io.ReadFull(c, b); err != nil {
				return
			}
			if _, err := c.Write(b); err != nil {
				return
			}
		}
	}()
	conn, err := netutil.DialContext(ctx, cliNS, "tcp", dial)
	if err != nil {
		return nil, 0, err
	}
	defer conn.Close()
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	one := []byte{1}
	start := time.Now()
	for time.Since(start) < dur {
		t := time.Now()
		if _, err := conn.Write(one); err != nil {
			return nil, 0, err
		}
		if _, err := io.ReadFull(conn, one); err != nil {
			return nil, 0, err
		}
		lat = append(lat, time.Since(t))
	}
	perS = float64(len(lat)) / time.Since(start).Seconds()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return lat, perS, nil
}
