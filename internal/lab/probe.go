package lab

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/lace-cni/lace/internal/netutil"
)

// probe runs the container's readiness and liveness probes for as long as
// ctx lives. Network probes are sent from the node's namespace, as kubelet
// sends them from the host.
func (p *pod) probe(ctx context.Context, c *container) {
	ready, live := c.spec.ReadinessProbe, c.spec.LivenessProbe
	readySucc, readyFail, liveFail := 0, 0, 0
	var lastStart time.Time
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	var nextReady, nextLive time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		c.mu.Lock()
		running, startedAt := c.cmd != nil, c.startedAt
		c.mu.Unlock()
		if !running {
			continue
		}
		now := time.Now()
		if !startedAt.Equal(lastStart) {
			// A new process: probes start over after their initial delay.
			lastStart = startedAt
			readySucc, readyFail, liveFail = 0, 0, 0
			nextReady = startedAt.Add(initialDelay(ready))
			nextLive = startedAt.Add(initialDelay(live))
			if ready == nil {
				c.mu.Lock()
				c.ready = true
				c.mu.Unlock()
				p.changed()
			}
		}
		if ready != nil && !now.Before(nextReady) {
			nextReady = now.Add(period(ready))
			err := p.runProbe(ctx, c, ready)
			if err == nil {
				readySucc, readyFail = readySucc+1, 0
			} else {
				readySucc, readyFail = 0, readyFail+1
			}
			c.mu.Lock()
			was := c.ready
			if readySucc >= int(max(ready.SuccessThreshold, 1)) {
				c.ready = true
			}
			if readyFail >= int(threshold(ready)) {
				c.ready = false
			}
			now := c.ready
			c.mu.Unlock()
			if was != now {
				p.k.log.Info("readiness changed", "pod", p.key(), "container", c.spec.Name, "ready", now, "err", err)
				p.changed()
			}
		}
		if live != nil && !now.Before(nextLive) {
			nextLive = now.Add(period(live))
			if err := p.runProbe(ctx, c, live); err != nil {
				liveFail++
				if liveFail >= int(threshold(live)) {
					p.k.log.Info("liveness probe failed, restarting container", "pod", p.key(), "container", c.spec.Name, "err", err)
					liveFail = 0
					c.kill()
				}
			} else {
				liveFail = 0
			}
		}
	}
}

func initialDelay(pr *corev1.Probe) time.Duration {
	if pr == nil {
		return 0
	}
	return time.Duration(pr.InitialDelaySeconds) * time.Second
}

func period(pr *corev1.Probe) time.Duration {
	if pr.PeriodSeconds > 0 {
		return time.Duration(pr.PeriodSeconds) * time.Second
	}
	return 10 * time.Second
}

func threshold(pr *corev1.Probe) int32 {
	if pr.FailureThreshold > 0 {
		return pr.FailureThreshold
	}
	return 3
}

func probeTimeout(pr *corev1.Probe) time.Duration {
	if pr.TimeoutSeconds > 0 {
		return time.Duration(pr.TimeoutSeconds) * time.Second
	}
	return time.Second
}

// runProbe returns nil when the probe succeeds.
func (p *pod) runProbe(ctx context.Context, c *container, pr *corev1.Probe) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout(pr))
	defer cancel()
	switch {
	case pr.Exec != nil:
		if len(pr.Exec.Command) == 0 {
			return fmt.Errorf("exec probe without command")
		}
		argv := p.enter(pr.Exec.Command)
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Env = processEnv(p.k, p.snapshot(), &c.spec)
		return cmd.Run()
	case pr.HTTPGet != nil:
		port, err := resolvePort(pr.HTTPGet.Port, &c.spec)
		if err != nil {
			return err
		}
		host := pr.HTTPGet.Host
		if host == "" {
			host = p.podIP().String()
		}
		scheme := strings.ToLower(string(pr.HTTPGet.Scheme))
		if scheme == "" {
			scheme = "http"
		}
		url := fmt.Sprintf("%s://%s%s", scheme, net.JoinHostPort(host, strconv.Itoa(port)), pr.HTTPGet.Path)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		for _, h := range pr.HTTPGet.HTTPHeaders {
			req.Header.Add(h.Name, h.Value)
		}
		resp, err := p.k.nodeHTTP.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode >= 400 {
			return fmt.Errorf("HTTP probe answered %d", resp.StatusCode)
		}
		return nil
	case pr.TCPSocket != nil:
		port, err := resolvePort(pr.TCPSocket.Port, &c.spec)
		if err != nil {
			return err
		}
		host := pr.TCPSocket.Host
		if host == "" {
			host = p.podIP().String()
		}
		conn, err := netutil.DialContext(ctx, netutil.Path(p.k.nodeNS), "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return err
		}
		return conn.Close()
	}
	return fmt.Errorf("probe type not supported by the lab kubelet (exec, httpGet and tcpSocket are)")
}

func resolvePort(port intstr.IntOrString, c *corev1.Container) (int, error) {
	if port.Type == intstr.Int {
		return port.IntValue(), nil
	}
	for _, cp := range c.Ports {
		if cp.Name == port.StrVal {
			return int(cp.ContainerPort), nil
		}
	}
	if n, err := strconv.Atoi(port.StrVal); err == nil {
		return n, nil
	}
	return 0, fmt.Errorf("no container port named %q", port.StrVal)
}

// nodeHTTPClient sends HTTP requests from the node's namespace.
func nodeHTTPClient(nodeNS string) *http.Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if _, err := netip.ParseAddrPort(addr); err != nil {
				return nil, fmt.Errorf("probe address %q: the lab resolves no names", addr)
			}
			return netutil.DialContext(ctx, netutil.Path(nodeNS), network, addr)
		},
		DisableKeepAlives: true,
	}
	return &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}
