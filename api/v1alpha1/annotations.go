package v1alpha1

// AnnotationExternalIPProblem is written by lace-controller on a Service
// some of whose spec.externalIPs are not served: "Reason: external IPs not
// served: addr (reason: detail), ...". Its value changes only when the
// verdict does, and each change comes with a Warning Event, so an idle
// cluster stays quiet. Reasons: ExternalIPNotAllowed (outside the
// operator's allow-list), ExternalIPReserved (a node address, pod subnet
// or service range), ExternalIPInvalid, ExternalIPContested (an older
// Service, or a load balancer address, holds it).
const AnnotationExternalIPProblem = "lace-cni.io/external-ip-problem"
