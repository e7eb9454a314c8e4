package controller

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	ipamclaimsv1 "github.com/lace-cni/lace/api/ipamclaims/v1alpha1"
	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model/ipam"
	"github.com/lace-cni/lace/pkg/scheme"
)

// Options configure lace-controller.
type Options struct {
	// MetricsAddr serves Prometheus metrics ("0" disables).
	MetricsAddr string
	// HealthAddr serves /healthz and /readyz ("0" disables).
	HealthAddr string

	LeaderElection          bool
	LeaderElectionNamespace string
	LeaderElectionID        string

	// LocatorPool is cut into per-node SRv6 locators of LocatorLength bits.
	LocatorPool   netip.Prefix
	LocatorLength int

	// ReleaseGrace keeps a removed node's blocks reserved this long.
	ReleaseGrace time.Duration

	// AllowedExternalIPs are the only addresses Services' externalIPs may
	// name (the agents get the same list); the rest are reported.
	AllowedExternalIPs []netip.Prefix

	// SkipNameValidation allows several managers in one process (tests that
	// restart the controller or run two for leader election).
	SkipNameValidation bool
}

// DefaultOptions are the flag defaults of lace-controller.
func DefaultOptions() Options {
	return Options{
		MetricsAddr:             ":8080",
		HealthAddr:              ":8081",
		LeaderElection:          true,
		LeaderElectionNamespace: "kube-system",
		LeaderElectionID:        "lace-controller",
		LocatorPool:             netip.MustParsePrefix("fd1a:ce::/48"),
		LocatorLength:           64,
		ReleaseGrace:            30 * time.Second,
	}
}

// WaitForAPIServer returns once the API server answers discovery and
// serves every kind of the CRDs the controller watches (or ctx ends).
// Building the manager needs it (the cache's types are looked up at
// once), and failing there would make a controller that starts during an
// outage, or on a node cut off from the API server, crash-loop until it
// is back; this waits instead, as kube-controller-manager does. The
// kinds are awaited too because a restarted API server answers /version
// before its CRD handler has synced: a controller that lost its Lease in
// the outage and started again then found no NetworkEndpoint kind and
// exited a second time.
//
// Meanwhile healthAddr (when not "" or "0") answers the kubelet's probes:
// alive, not ready. Without it the liveness probe would restart a
// waiting controller into the same wait, a crash loop of its own.
func WaitForAPIServer(ctx context.Context, cfg *rest.Config, healthAddr string, log *slog.Logger) error {
	dc, err := discovery.NewDiscoveryClientForConfig(rest.CopyConfig(cfg))
	if err != nil {
		return fmt.Errorf("discovery client: %w", err)
	}
	if healthAddr != "" && healthAddr != "0" {
		stop, err := serveWaiting(healthAddr)
		if err != nil {
			return err
		}
		// The manager binds the same address next.
		defer stop()
	}
	delay := 500 * time.Millisecond
	for waitingFor := ""; ; {
		err := servesCRDKinds(dc)
		if err == nil {
			if waitingFor != "" {
				log.Info("API server reachable, serving Lace's kinds")
			}
			return nil
		}
		// Logged once per distinct reason, so a long outage is one line
		// and the step from "unreachable" to "kinds missing" shows.
		if msg := err.Error(); msg != waitingFor {
			log.Info("waiting for the API server", "err", err)
			waitingFor = msg
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the API server: %w (last: %v)", ctx.Err(), err)
		case <-time.After(delay):
		}
		delay = min(2*delay, 10*time.Second)
	}
}

// crdGroupVersions are the group versions of the scheme that CRDs serve
// (the chart installs them), as opposed to the API server's own.
var crdGroupVersions = []schema.GroupVersion{lacev1.GroupVersion, ipamclaimsv1.GroupVersion}

// servesCRDKinds fails unless the API server answers and its discovery
// lists every object kind of crdGroupVersions the scheme knows.
func servesCRDKinds(dc discovery.DiscoveryInterface) error {
	if _, err := dc.ServerVersion(); err != nil {
		return err
	}
	for _, gv := range crdGroupVersions {
		list, err := dc.ServerResourcesForGroupVersion(gv.String())
		if err != nil {
			return fmt.Errorf("discover %s: %w", gv, err)
		}
		served := map[string]bool{}
		for _, r := range list.APIResources {
			served[r.Kind] = true
		}
		var missing []string
		for kind, t := range scheme.Scheme.KnownTypes(gv) {
			// Lists and the option kinds every group version carries
			// are no resources of their own.
			if strings.HasSuffix(kind, "List") || !reflect.PointerTo(t).Implements(objectType) {
				continue
			}
			if !served[kind] {
				missing = append(missing, kind)
			}
		}
		if len(missing) > 0 {
			slices.Sort(missing)
			return fmt.Errorf("%s does not serve %s yet (are Lace's CRDs installed?)", gv, strings.Join(missing, ", "))
		}
	}
	return nil
}

// objectType is client.Object, which every resource kind implements.
var objectType = reflect.TypeFor[client.Object]()

// serveWaiting answers /healthz (alive) and nothing else (not ready) on
// addr until stop returns.
func serveWaiting(addr string) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("serve health while waiting: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return func() { _ = srv.Close() }, nil
}

// NewManager builds the controller manager with every reconciler registered.
func NewManager(cfg *rest.Config, o Options) (manager.Manager, error) {
	if !o.LocatorPool.Addr().Is6() {
		return nil, fmt.Errorf("SRv6 locator pool %s is not IPv6", o.LocatorPool)
	}
	pool, err := ipam.NewPool(o.LocatorPool, o.LocatorLength)
	if err != nil {
		return nil, fmt.Errorf("SRv6 locator pool: %w", err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        scheme.Scheme,
		Metrics:                       metricsserver.Options{BindAddress: o.MetricsAddr},
		HealthProbeBindAddress:        o.HealthAddr,
		LeaderElection:                o.LeaderElection,
		LeaderElectionNamespace:       o.LeaderElectionNamespace,
		LeaderElectionID:              o.LeaderElectionID,
		LeaderElectionReleaseOnCancel: true,
		Controller:                    config.Controller{SkipNameValidation: &o.SkipNameValidation},
		Cache:                         cache.Options{ByObject: map[client.Object]cache.ByObject{&corev1.Pod{}: hostPodsCache()}},
	})
	if err != nil {
		return nil, fmt.Errorf("create manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, fmt.Errorf("add healthz: %w", err)
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return nil, fmt.Errorf("add readyz: %w", err)
	}
	recorder := mgr.GetEventRecorderFor("lace-controller")
	if err := (&NetworkReconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: recorder, ReleaseGrace: o.ReleaseGrace,
	}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("setup network controller: %w", err)
	}
	if err := (&LocatorReconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: recorder, Pool: pool,
	}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("setup locator controller: %w", err)
	}
	if err := (&BindingPolicyReconciler{Client: mgr.GetClient(), Recorder: recorder}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("setup binding policy controller: %w", err)
	}
	if err := (&ServiceReconciler{Client: mgr.GetClient(), Recorder: recorder, Allowed: o.AllowedExternalIPs}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("setup service controller: %w", err)
	}
	if err := (&UnderlayAddressReconciler{Client: mgr.GetClient(), Recorder: recorder, Allowed: o.AllowedExternalIPs}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("setup underlay address controller: %w", err)
	}
	if err := (&NetworkEndpointReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: recorder}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("setup network endpoint controller: %w", err)
	}
	if err := (&L2AddressReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: recorder}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("setup l2 address controller: %w", err)
	}
	if err := (&L2LearnReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: recorder}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("setup l2 learning controller: %w", err)
	}
	if err := (&IPAMClaimReconciler{Client: mgr.GetClient()}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("setup IPAMClaim controller: %w", err)
	}
	if err := (&RoutingPolicyReconciler{Client: mgr.GetClient(), Recorder: recorder}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("setup routing policy controller: %w", err)
	}
	if err := (&ExternalIPReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: recorder, Allowed: o.AllowedExternalIPs}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("setup external IP controller: %w", err)
	}
	if err := (&LoadBalancerReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: recorder,
		AllowedExternalIPs: o.AllowedExternalIPs}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("setup load balancer controller: %w", err)
	}
	return mgr, nil
}
