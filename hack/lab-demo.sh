#!/usr/bin/env bash
# A short tour of a running lab: a Deployment of agnhost netexec behind a
# Service, its pods spread over the nodes, and a request between two pods.
set -euo pipefail
name=${1:-lace}
bin=$(cd "$(dirname "$0")/.." && pwd)/bin
k8s=${LACE_K8S_BIN:-$HOME/.cache/lace/k8s-v1.34.4}
export KUBECONFIG=$("$bin/lace-lab" kubeconfig --name "$name")
kubectl() { "$k8s/kubectl" "$@"; }

kubectl apply -f - >/dev/null <<'YAML'
apiVersion: apps/v1
kind: Deployment
metadata: {name: demo, namespace: default}
spec:
  replicas: 3
  selector: {matchLabels: {app: demo}}
  template:
    metadata: {labels: {app: demo}}
    spec:
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: ScheduleAnyway, labelSelector: {matchLabels: {app: demo}}}
      containers:
      - name: netexec
        image: registry.k8s.io/e2e-test-images/agnhost:2.53
        args: ["netexec", "--http-port=8080", "--udp-port=8081"]
        ports: [{containerPort: 8080, name: http}]
        readinessProbe: {httpGet: {path: /healthz, port: http}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: demo, namespace: default}
spec:
  selector: {app: demo}
  ports: [{port: 80, targetPort: http}]
YAML
kubectl rollout status deployment/demo --timeout=120s
echo
kubectl get nodes -L topology.kubernetes.io/zone
echo
kubectl get pods -l app=demo -o wide
echo
kubectl get endpointslices -l kubernetes.io/service-name=demo
echo
pods=($(kubectl get pods -l app=demo -o jsonpath='{.items[*].metadata.name}'))
ips=($(kubectl get pods -l app=demo -o jsonpath='{.items[*].status.podIP}'))
echo "${pods[0]} -> ${pods[1]} (${ips[1]}):"
kubectl exec "${pods[0]}" -- agnhost connect "${ips[1]}:8080" --timeout=5s && echo "  TCP connect ok"
echo
echo "Try: kubectl get pods -A; lace-lab status --name $name; make lab-down"
