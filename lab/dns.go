package lab

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/lace-cni/lace/lab/images"
)

// Cluster DNS (Config.DNS) is what kubeadm 1.34 deploys, so that workloads
// and the upstream e2e suite find the names they expect: CoreDNS in
// kube-system behind the kube-dns Service, at the .10 of the service
// range. The lab adds no kube-proxy: Lace serves kube-dns like any Service.
const (
	DNSNamespace  = "kube-system"
	DNSService    = "kube-dns"
	DNSDeployment = "coredns"
	// DNSReplicas is kubeadm's count; the anti-affinity spreads them.
	DNSReplicas = 2
	// dnsReadyTimeout bounds waitDNS: the pods start once Lace gives them
	// a network and take a few seconds to sync with the API server.
	dnsReadyTimeout = 2 * time.Minute
)

// DNSLabels select the CoreDNS pods (kubeadm's label, which e2e and
// kubectl's cluster-info look up).
var DNSLabels = map[string]string{"k8s-app": "kube-dns"}

// Corefile is kubeadm's, less `forward . /etc/resolv.conf`: nothing outside
// the lab answers, so a query for a name outside the cluster fails at once
// (SERVFAIL) instead of waiting for an upstream that never replies.
const Corefile = `.:53 {
    errors
    health {
       lameduck 5s
    }
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }
    prometheus :9153
    cache 30
    loop
    reload
    loadbalance
}
`

// dnsObjects are the cluster DNS objects in the order they are created:
// what the Deployment's pods need exists before they start.
func dnsObjects() (*corev1.ServiceAccount, *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding,
	*corev1.ConfigMap, *appsv1.Deployment, *corev1.Service) {
	meta := func(name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Namespace: DNSNamespace}
	}
	sa := &corev1.ServiceAccount{ObjectMeta: meta(DNSDeployment)}
	rbacMeta := metav1.ObjectMeta{Name: "system:coredns",
		Labels:      map[string]string{"kubernetes.io/bootstrapping": "rbac-defaults"},
		Annotations: map[string]string{"rbac.authorization.kubernetes.io/autoupdate": "true"}}
	role := &rbacv1.ClusterRole{ObjectMeta: rbacMeta, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"endpoints", "services", "pods", "namespaces"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
	}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: rbacMeta,
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: DNSNamespace}}}
	cm := &corev1.ConfigMap{ObjectMeta: meta(DNSDeployment), Data: map[string]string{"Corefile": Corefile}}

	podLabels := map[string]string{}
	for k, v := range DNSLabels {
		podLabels[k] = v
	}
	dep := &appsv1.Deployment{ObjectMeta: meta(DNSDeployment), Spec: appsv1.DeploymentSpec{
		Replicas: ptr.To[int32](DNSReplicas),
		Selector: &metav1.LabelSelector{MatchLabels: DNSLabels},
		Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType,
			RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: ptr.To(intstr.FromInt32(1))}},
		Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: podLabels},
			Spec: corev1.PodSpec{
				PriorityClassName:  "system-cluster-critical",
				ServiceAccountName: sa.Name,
				Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
					PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
						Weight: 100,
						PodAffinityTerm: corev1.PodAffinityTerm{
							LabelSelector: &metav1.LabelSelector{MatchLabels: DNSLabels},
							TopologyKey:   corev1.LabelHostname,
						},
					}},
				}},
				Tolerations: []corev1.Toleration{
					{Key: "CriticalAddonsOnly", Operator: corev1.TolerationOpExists},
					{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule},
				},
				NodeSelector: map[string]string{corev1.LabelOSStable: "linux"},
				// The node's resolv.conf, not the cluster's: CoreDNS is
				// what the cluster's points at.
				DNSPolicy: corev1.DNSDefault,
				Containers: []corev1.Container{{
					Name:            "coredns",
					Image:           images.CoreDNSRef,
					ImagePullPolicy: corev1.PullIfNotPresent,
					Args:            []string{"-conf", "/etc/coredns/Corefile"},
					Resources: corev1.ResourceRequirements{
						Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("170Mi")},
						Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"),
							corev1.ResourceMemory: resource.MustParse("70Mi")},
					},
					VolumeMounts: []corev1.VolumeMount{{Name: "config-volume", MountPath: "/etc/coredns", ReadOnly: true}},
					Ports: []corev1.ContainerPort{
						{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
						{Name: "dns-tcp", ContainerPort: 53, Protocol: corev1.ProtocolTCP},
						{Name: "metrics", ContainerPort: 9153, Protocol: corev1.ProtocolTCP},
					},
					LivenessProbe: &corev1.Probe{
						ProbeHandler:        corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstr.FromInt32(8080), Scheme: corev1.URISchemeHTTP}},
						InitialDelaySeconds: 60, TimeoutSeconds: 5, SuccessThreshold: 1, FailureThreshold: 5,
					},
					ReadinessProbe: &corev1.Probe{
						ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromInt32(8181), Scheme: corev1.URISchemeHTTP}},
					},
					SecurityContext: &corev1.SecurityContext{
						AllowPrivilegeEscalation: ptr.To(false),
						Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_BIND_SERVICE"},
							Drop: []corev1.Capability{"ALL"}},
						ReadOnlyRootFilesystem: ptr.To(true),
					},
				}},
				Volumes: []corev1.Volume{{Name: "config-volume", VolumeSource: corev1.VolumeSource{
					ConfigMap: &corev1.ConfigMapVolumeSource{
						LocalObjectReference: corev1.LocalObjectReference{Name: cm.Name},
						Items:                []corev1.KeyToPath{{Key: "Corefile", Path: "Corefile"}},
					}}}},
			},
		},
	}}

	// Dual-stack like the lab: a pod of either family has a resolver.
	var ips []string
	var families []corev1.IPFamily
	for _, a := range DNSAddrs() {
		ips = append(ips, a.String())
		if a.Is4() {
			families = append(families, corev1.IPv4Protocol)
		} else {
			families = append(families, corev1.IPv6Protocol)
		}
	}
	svcMeta := meta(DNSService)
	svcMeta.Labels = map[string]string{"k8s-app": "kube-dns", "kubernetes.io/cluster-service": "true", "kubernetes.io/name": "CoreDNS"}
	svcMeta.Annotations = map[string]string{"prometheus.io/port": "9153", "prometheus.io/scrape": "true"}
	svc := &corev1.Service{ObjectMeta: svcMeta, Spec: corev1.ServiceSpec{
		Selector:       DNSLabels,
		ClusterIP:      ips[0],
		ClusterIPs:     ips,
		IPFamilies:     families,
		IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicyRequireDualStack),
		Ports: []corev1.ServicePort{
			{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(53)},
			{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(53)},
			{Name: "metrics", Port: 9153, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(9153)},
		},
	}}
	return sa, role, binding, cm, dep, svc
}

// installDNS creates the cluster DNS objects; one that exists is left as
// it is (a lab is new). The Service goes first, to claim its fixed
// addresses before anything else could be given them. Each create is
// retried for a while: right after the API server turns ready, its
// default ServiceCIDR may not be there yet to allocate from.
func installDNS(ctx context.Context, c kubernetes.Interface) error {
	sa, role, binding, cm, dep, svc := dnsObjects()
	opts := metav1.CreateOptions{}
	steps := []struct {
		what   string
		create func() error
	}{
		{"Service " + svc.Name, func() error { _, err := c.CoreV1().Services(DNSNamespace).Create(ctx, svc, opts); return err }},
		{"ServiceAccount " + sa.Name, func() error { _, err := c.CoreV1().ServiceAccounts(DNSNamespace).Create(ctx, sa, opts); return err }},
		{"ClusterRole " + role.Name, func() error { _, err := c.RbacV1().ClusterRoles().Create(ctx, role, opts); return err }},
		{"ClusterRoleBinding " + binding.Name, func() error {
			_, err := c.RbacV1().ClusterRoleBindings().Create(ctx, binding, opts)
			return err
		}},
		{"ConfigMap " + cm.Name, func() error { _, err := c.CoreV1().ConfigMaps(DNSNamespace).Create(ctx, cm, opts); return err }},
		{"Deployment " + dep.Name, func() error { _, err := c.AppsV1().Deployments(DNSNamespace).Create(ctx, dep, opts); return err }},
	}
	for _, s := range steps {
		deadline := time.Now().Add(30 * time.Second)
		for {
			err := s.create()
			if err == nil || apierrors.IsAlreadyExists(err) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("cluster DNS: create %s/%s: %w", DNSNamespace, s.what, err)
			}
			if !sleepCtx(ctx, time.Second) {
				return ctx.Err()
			}
		}
	}
	return nil
}

// waitDNS waits until every CoreDNS replica is Ready (CoreDNS's /ready
// answers once the kubernetes plugin has synced with the API server) and
// the kube-dns Service has them as endpoints.
func waitDNS(ctx context.Context, c kubernetes.Interface, alive func() error) error {
	deadline := time.Now().Add(dnsReadyTimeout)
	var last string
	for time.Now().Before(deadline) {
		if err := alive(); err != nil {
			return err
		}
		last = dnsProgress(ctx, c)
		if last == "" {
			return nil
		}
		if !sleepCtx(ctx, 500*time.Millisecond) {
			return ctx.Err()
		}
	}
	return fmt.Errorf("cluster DNS not ready after %s: %s", dnsReadyTimeout, last)
}

// dnsProgress says what cluster DNS still lacks, naming each pod that is
// not Ready and why, or "" when it is ready.
func dnsProgress(ctx context.Context, c kubernetes.Interface) string {
	pods, err := c.CoreV1().Pods(DNSNamespace).List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-dns"})
	if err != nil {
		return err.Error()
	}
	var waiting []string
	ready := 0
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		if why := podNotReady(&p); why != "" {
			waiting = append(waiting, fmt.Sprintf("pod %s/%s (node %q): %s", p.Namespace, p.Name, p.Spec.NodeName, why))
			continue
		}
		ready++
	}
	sort.Strings(waiting)
	if ready < DNSReplicas {
		if len(waiting) == 0 {
			return fmt.Sprintf("Deployment %s/%s: %d of %d CoreDNS pods exist", DNSNamespace, DNSDeployment, len(pods.Items), DNSReplicas)
		}
		return fmt.Sprintf("%d of %d CoreDNS pods Ready; %s", ready, DNSReplicas, strings.Join(waiting, "; "))
	}
	slices, err := c.DiscoveryV1().EndpointSlices(DNSNamespace).List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=" + DNSService})
	if err != nil {
		return err.Error()
	}
	eps := 0
	for _, s := range slices.Items {
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && *e.Conditions.Ready {
				eps++
			}
		}
	}
	// One slice per family: each ready pod appears once in each.
	if eps < DNSReplicas*len(DNSAddrs()) {
		return fmt.Sprintf("Service %s/%s has %d ready endpoints, want %d", DNSNamespace, DNSService, eps, DNSReplicas*len(DNSAddrs()))
	}
	return ""
}

// podNotReady says why a pod is not Ready ("" when it is): its phase, the
// scheduler's or a container's reason, or the last termination.
func podNotReady(p *corev1.Pod) string {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
			return ""
		}
	}
	why := string(p.Status.Phase)
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodScheduled && cond.Status != corev1.ConditionTrue && cond.Message != "" {
			why += ", unschedulable: " + cond.Message
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		switch {
		case cs.State.Waiting != nil:
			why += fmt.Sprintf(", %s waiting: %s %s", cs.Name, cs.State.Waiting.Reason, cs.State.Waiting.Message)
		case cs.State.Running != nil && !cs.Ready:
			why += fmt.Sprintf(", %s running, not ready (readiness :8181/ready)", cs.Name)
		}
		if t := cs.LastTerminationState.Terminated; t != nil {
			why += fmt.Sprintf(", last exit %d (%s) after %d restarts", t.ExitCode, t.Reason, cs.RestartCount)
		}
	}
	return strings.TrimSpace(why)
}
