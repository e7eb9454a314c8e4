// Package scheme is the runtime.Scheme every Lace binary uses: the core
// Kubernetes kinds, lace-cni.io/v1alpha1 and the IPAMClaim of
// k8s.cni.cncf.io/v1alpha1.
package scheme

import (
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	ipamclaimsv1 "github.com/lace-cni/lace/api/ipamclaims/v1alpha1"
	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
)

// Scheme knows the core kinds and the lace-cni.io kinds.
var Scheme = runtime.NewScheme()

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(Scheme))
	utilruntime.Must(lacev1.AddToScheme(Scheme))
	utilruntime.Must(ipamclaimsv1.AddToScheme(Scheme))
}
