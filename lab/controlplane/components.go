package controlplane

import (
	"fmt"
	"path/filepath"
	"time"
)

// StartControllerManager runs kube-controller-manager against the control
// plane with cluster-admin credentials. Its controllers (deployments,
// replica sets, endpoint slices, garbage collection, node lifecycle, service
// accounts) are what make the lab behave like a cluster.
func (cp *ControlPlane) StartControllerManager(extra ...string) (*Process, error) {
	return cp.startComponent("kube-controller-manager", "system:kube-controller-manager", append([]string{
		"--use-service-account-credentials=false",
		"--service-account-private-key-file=" + cp.PKI.SAKey,
		"--root-ca-file=" + cp.PKI.CACert,
		"--cluster-signing-cert-file=" + cp.PKI.CACert,
		"--cluster-signing-key-file=" + cp.PKI.CAKey,
		"--service-cluster-ip-range=" + cp.Opts.ServiceCIDRs,
		"--controllers=*,-cloud-node-lifecycle,-service-lb-controller,-node-route-controller",
		"--node-monitor-grace-period=40s",
	}, extra...))
}

// StartScheduler runs kube-scheduler against the control plane.
func (cp *ControlPlane) StartScheduler(extra ...string) (*Process, error) {
	return cp.startComponent("kube-scheduler", "system:kube-scheduler", extra)
}

// startComponent runs a Kubernetes component with its own kubeconfig (user
// in system:masters), serving nothing, without leader election.
func (cp *ControlPlane) startComponent(name, user string, args []string) (*Process, error) {
	kc := filepath.Join(cp.Opts.Dir, name+".kubeconfig")
	if err := cp.WriteKubeconfig(kc, user, []string{"system:masters"}); err != nil {
		return nil, err
	}
	args = append([]string{
		"--kubeconfig=" + kc,
		"--authentication-kubeconfig=" + kc,
		"--authorization-kubeconfig=" + kc,
		"--bind-address=127.0.0.1",
		"--secure-port=0",
		"--leader-elect=false",
		"--v=1",
	}, args...)
	p, err := StartProcess(name, filepath.Join(cp.Opts.BinDir, name), args, filepath.Join(cp.Opts.Dir, "logs", name+".log"))
	if err != nil {
		return nil, err
	}
	return p, cp.checkAlive(p)
}

// checkAlive gives a component a moment to fail on bad flags, so that a
// misconfiguration is reported at start rather than discovered later.
func (cp *ControlPlane) checkAlive(p *Process) error {
	time.Sleep(500 * time.Millisecond)
	if p.Exited() {
		return fmt.Errorf("%s %v: %s", p.Name, p.ExitError(), p.LogTail(2000))
	}
	return nil
}

// Processes returns the running control plane processes.
func (cp *ControlPlane) Processes() []*Process {
	var out []*Process
	for _, p := range []*Process{cp.etcd, cp.apiserver} {
		if p != nil {
			out = append(out, p)
		}
	}
	return out
}
