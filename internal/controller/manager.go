package controller

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

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

// WaitForAPIServer returns once the API server answers discovery (or ctx
// ends). Building the manager needs it (the cache's types are looked up
// at once), and failing there would make a controller that starts during
// an outage, or on a node cut off from the API server, crash-loop until
// it is back; this waits instead, as kube-controller-manager does.
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
	for logged := false; ; {
		_, err := dc.ServerVersion()
		if err == nil {
			if logged {
				log.Info("API server reachable")
			}
			return nil
		}
		if !logged {
			log.Info("waiting for the API server", "err", err)
			logged = true
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the API server: %w (last: %v)", ctx.Err(), err)
		case <-time.After(delay):
		}
		delay = min(2*delay, 10*time.Second)
	}
}

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
