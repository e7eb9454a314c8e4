// Package controlplane runs a real Kubernetes control plane (etcd and
// kube-apiserver, built from the pinned tools module) as local processes on
// loopback, for tests and the lab. It owns those processes, their
// certificates and their data directories, and nothing else: it never
// touches network namespaces, links or routes.
package controlplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/lace-cni/lace/config/crd"
)

// K8sVersion is the Kubernetes release the tools module pins.
const K8sVersion = "v1.34.4"

// Options configure a control plane.
type Options struct {
	// BinDir holds etcd and kube-apiserver (see DefaultBinDir).
	BinDir string
	// Dir is the state directory: certificates, etcd data, logs.
	Dir string
	// ServiceCIDRs is the service IP range(s), comma separated.
	ServiceCIDRs string
	// ExtraAPIServerArgs are appended to the kube-apiserver command line.
	ExtraAPIServerArgs []string
	// BeforeAPIServer, when set, runs once the PKI exists and before
	// kube-apiserver starts (to issue certificates its flags name).
	BeforeAPIServer func(*PKI) error
}

// DefaultBinDir is where `make k8s-bins` puts the binaries: $LACE_K8S_BIN,
// or ~/.cache/lace/k8s-<version>.
func DefaultBinDir() string {
	if d := os.Getenv("LACE_K8S_BIN"); d != "" {
		return d
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "lace", "k8s-"+K8sVersion)
}

// MissingBinaries lists the binaries of names that are not in dir.
func MissingBinaries(dir string, names ...string) []string {
	var missing []string
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
			missing = append(missing, n)
		}
	}
	return missing
}

// ControlPlane is a running etcd and kube-apiserver.
type ControlPlane struct {
	Opts         Options
	PKI          *PKI
	EtcdURL      string
	APIServerURL string
	// AdminKubeconfig is a kubeconfig with cluster-admin rights.
	AdminKubeconfig string

	etcd, apiserver *Process
	// The arguments each was started with: a restart reuses them, so its
	// URL (and every kubeconfig and relay pointing at it) stays valid.
	etcdArgs, apiserverArgs []string
}

// Start launches etcd and kube-apiserver and waits until the API server is
// ready. On error everything started is stopped again.
func Start(ctx context.Context, o Options) (cp *ControlPlane, err error) {
	if o.BinDir == "" {
		o.BinDir = DefaultBinDir()
	}
	if o.ServiceCIDRs == "" {
		o.ServiceCIDRs = "10.96.0.0/16,fd00:96::/108"
	}
	if m := MissingBinaries(o.BinDir, "etcd", "kube-apiserver"); len(m) > 0 {
		return nil, fmt.Errorf("missing %v in %s: run 'make k8s-bins'", m, o.BinDir)
	}
	pki, err := NewPKI(filepath.Join(o.Dir, "pki"))
	if err != nil {
		return nil, err
	}
	// The aggregation layer's front proxy (frontproxy.go), as kubeadm
	// sets it up: aggregated API servers need it to authenticate the
	// requests the API server proxies to them.
	if err := pki.IssueFrontProxy(); err != nil {
		return nil, err
	}
	cp = &ControlPlane{Opts: o, PKI: pki}
	defer func() {
		if err != nil {
			cp.Stop()
		}
	}()
	if err := cp.startEtcd(ctx); err != nil {
		return nil, err
	}
	if o.BeforeAPIServer != nil {
		if err := o.BeforeAPIServer(pki); err != nil {
			return nil, err
		}
	}
	if err := cp.startAPIServer(ctx); err != nil {
		return nil, err
	}
	return cp, nil
}

func (cp *ControlPlane) startEtcd(ctx context.Context) error {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		client, err1 := FreePort()
		peer, err2 := FreePort()
		if err := errors.Join(err1, err2); err != nil {
			return err
		}
		cp.EtcdURL = "http://" + hostPort(client)
		peerURL := "http://" + hostPort(peer)
		dataDir := filepath.Join(cp.Opts.Dir, "etcd")
		cp.etcdArgs = []string{
			"--name=lace", "--data-dir=" + dataDir,
			"--listen-client-urls=" + cp.EtcdURL, "--advertise-client-urls=" + cp.EtcdURL,
			"--listen-peer-urls=" + peerURL, "--initial-advertise-peer-urls=" + peerURL,
			"--initial-cluster=lace=" + peerURL,
			// Tests and the lab value speed over durability.
			"--unsafe-no-fsync", "--quota-backend-bytes=2147483648",
			"--log-level=warn",
		}
		if lastErr = cp.launchEtcd(ctx); lastErr == nil {
			return nil
		}
		if cp.etcd != nil {
			cp.etcd.Stop(5 * time.Second)
		}
	}
	return fmt.Errorf("start etcd: %w", lastErr)
}

func (cp *ControlPlane) startAPIServer(ctx context.Context) error {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := FreePort()
		if err != nil {
			return err
		}
		cp.APIServerURL = "https://" + hostPort(port)
		args := []string{
			"--etcd-servers=" + cp.EtcdURL,
			"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(port),
			"--tls-cert-file=" + cp.PKI.ServingCert, "--tls-private-key-file=" + cp.PKI.ServingK,
			"--client-ca-file=" + cp.PKI.CACert,
			"--service-account-issuer=https://kubernetes.default.svc",
			"--service-account-key-file=" + cp.PKI.SAPub,
			"--service-account-signing-key-file=" + cp.PKI.SAKey,
			"--service-cluster-ip-range=" + cp.Opts.ServiceCIDRs,
			"--authorization-mode=Node,RBAC",
			"--allow-privileged=true",
			"--enable-priority-and-fairness=false",
			"--v=1",
		}
		args = append(args, FrontProxyArgs(cp.PKI.Dir)...)
		cp.apiserverArgs = append(args, cp.Opts.ExtraAPIServerArgs...)
		cp.AdminKubeconfig = filepath.Join(cp.Opts.Dir, "admin.kubeconfig")
		if err := cp.WriteKubeconfig(cp.AdminKubeconfig, "lace-admin", []string{"system:masters"}); err != nil {
			return err
		}
		if lastErr = cp.launchAPIServer(ctx); lastErr == nil {
			return nil
		}
		if cp.apiserver != nil {
			cp.apiserver.Stop(5 * time.Second)
		}
	}
	return fmt.Errorf("start kube-apiserver: %w", lastErr)
}

func (cp *ControlPlane) launchEtcd(ctx context.Context) error {
	p, err := StartProcess("etcd", filepath.Join(cp.Opts.BinDir, "etcd"), cp.etcdArgs, filepath.Join(cp.Opts.Dir, "logs", "etcd.log"))
	if err != nil {
		return err
	}
	cp.etcd = p
	return waitHTTP(ctx, cp.EtcdURL+"/health", p, 30*time.Second)
}

func (cp *ControlPlane) launchAPIServer(ctx context.Context) error {
	p, err := StartProcess("kube-apiserver", filepath.Join(cp.Opts.BinDir, "kube-apiserver"), cp.apiserverArgs,
		filepath.Join(cp.Opts.Dir, "logs", "kube-apiserver.log"))
	if err != nil {
		return err
	}
	cp.apiserver = p
	return cp.waitReady(ctx, p)
}

// Components that StopComponent and StartComponent take down and bring
// back: the outages a control plane has.
const (
	ComponentEtcd      = "etcd"
	ComponentAPIServer = "apiserver"
)

// StopComponent stops etcd or the API server (SIGTERM, then SIGKILL) and
// returns the process that ended. Not safe to call concurrently with
// StartComponent.
func (cp *ControlPlane) StopComponent(name string) (*Process, error) {
	p, err := cp.component(name)
	if err != nil {
		return nil, err
	}
	p.Stop(10 * time.Second)
	return p, nil
}

// StartComponent starts a stopped etcd or API server again with the
// arguments (and so the URL) it had, and waits until it serves; it returns
// the new process. Starting a running component is a no-op.
func (cp *ControlPlane) StartComponent(ctx context.Context, name string) (*Process, error) {
	p, err := cp.component(name)
	if err != nil {
		return nil, err
	}
	if !p.Exited() {
		return p, nil
	}
	if name == ComponentEtcd {
		err = cp.launchEtcd(ctx)
		return cp.etcd, err
	}
	err = cp.launchAPIServer(ctx)
	return cp.apiserver, err
}

func (cp *ControlPlane) component(name string) (*Process, error) {
	var p *Process
	switch name {
	case ComponentEtcd:
		p = cp.etcd
	case ComponentAPIServer:
		p = cp.apiserver
	default:
		return nil, fmt.Errorf("no control plane component %q (%s or %s)", name, ComponentEtcd, ComponentAPIServer)
	}
	if p == nil {
		return nil, fmt.Errorf("%s was never started", name)
	}
	return p, nil
}

func (cp *ControlPlane) waitReady(ctx context.Context, p *Process) error {
	cs, err := kubernetes.NewForConfig(cp.RESTConfig())
	if err != nil {
		return err
	}
	var last error
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		if p.Exited() {
			return false, fmt.Errorf("%s %v: %s", p.Name, p.ExitError(), p.LogTail(2000))
		}
		_, last = cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("wait for readyz: %w (last: %v)", err, last)
	}
	return nil
}

// RESTConfig returns a cluster-admin client configuration.
func (cp *ControlPlane) RESTConfig() *rest.Config {
	cfg, err := clientcmd.BuildConfigFromFlags("", cp.AdminKubeconfig)
	if err != nil {
		// The file was written by WriteKubeconfig; failing to read it back
		// is a programming error.
		panic(fmt.Sprintf("read admin kubeconfig: %v", err))
	}
	cfg.QPS, cfg.Burst = 200, 400
	return cfg
}

// WriteKubeconfig issues a client certificate for user in groups and writes
// a kubeconfig for it to path.
func (cp *ControlPlane) WriteKubeconfig(path, user string, groups []string) error {
	certPath := filepath.Join(cp.PKI.Dir, user+".crt")
	keyPath := filepath.Join(cp.PKI.Dir, user+".key")
	if err := cp.PKI.Issue(certPath, keyPath, user, groups, nil, nil, false); err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["lace"] = &clientcmdapi.Cluster{Server: cp.APIServerURL, CertificateAuthority: cp.PKI.CACert}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificate: certPath, ClientKey: keyPath}
	cfg.Contexts["lace"] = &clientcmdapi.Context{Cluster: "lace", AuthInfo: user}
	cfg.CurrentContext = "lace"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return nil
}

// Stop stops kube-apiserver and etcd. It is safe to call more than once.
func (cp *ControlPlane) Stop() {
	for _, p := range []*Process{cp.apiserver, cp.etcd} {
		if p != nil {
			p.Stop(10 * time.Second)
		}
	}
}

// InstallCRDs creates or updates the lace-cni.io CRDs and waits until the
// API server serves them.
func InstallCRDs(ctx context.Context, cfg *rest.Config) error {
	crds, err := crd.All()
	if err != nil {
		return err
	}
	cs, err := apiextclient.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("apiextensions client: %w", err)
	}
	api := cs.ApiextensionsV1().CustomResourceDefinitions()
	for _, want := range crds {
		got, err := api.Get(ctx, want.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = api.Create(ctx, want, metav1.CreateOptions{})
		case err == nil:
			want.ResourceVersion = got.ResourceVersion
			_, err = api.Update(ctx, want, metav1.UpdateOptions{})
		}
		if err != nil {
			return fmt.Errorf("install CRD %s: %w", want.Name, err)
		}
	}
	for _, want := range crds {
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			got, err := api.Get(ctx, want.Name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			for _, c := range got.Status.Conditions {
				if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("wait for CRD %s to be established: %w", want.Name, err)
		}
	}
	return nil
}
