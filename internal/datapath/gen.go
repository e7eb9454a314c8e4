package datapath

// The eBPF objects are compiled from ../../bpf and committed; `make generate`
// rebuilds them. Types shared with Go are emitted once, from the pod object.
// The drop reason and counter tables come from the enums of lace.h.
// The lace_ctv2 objects are a test build whose conntrack value layout
// differs (LACE_TEST_CT_V2): the upgrade test migrates pinned flows to it.
//go:generate go run ./reasongen ../../bpf/include/lace.h reasons_gen.go
//go:generate go tool bpf2go -go-package datapath -tags !lace_ctv2 -cc clang -cflags "-O2 -g -Wall -Werror" -target bpfel -type ep_key -type ep_val -type port_val -type route_key -type route_val -type net_val -type class_key -type ct_key -type ct_val -type snat_key -type snat_val -type snat_fail_val -type svc_key -type svc_val -type backend_key -type backend_val -type affinity_key -type affinity_val -type host_key -type lace_config -type pol_ep_val -type pol_peer_key -type pol_cidr_key -type pol_key -type pol_val -type flow_cfg pod ../../bpf/pod.c -- -I../../bpf/include -I/usr/include/x86_64-linux-gnu
//go:generate go tool bpf2go -go-package datapath -tags !lace_ctv2 -cc clang -cflags "-O2 -g -Wall -Werror" -target bpfel underlay ../../bpf/underlay.c -- -I../../bpf/include -I/usr/include/x86_64-linux-gnu
//go:generate go tool bpf2go -go-package datapath -cc clang -cflags "-O2 -g -Wall -Werror" -target bpfel -type l2_neigh_key -type l2_neigh_val -type fdb_key -type fdb_val -type l2_flood_key -type l2_flood_val -type l2_net_val -type l2_learn_event l2 ../../bpf/l2.c -- -I../../bpf/include -I/usr/include/x86_64-linux-gnu
//go:generate go tool bpf2go -go-package datapath -cc clang -cflags "-O2 -g -Wall -Werror" -target bpfel -type sock_rnat_key -type sock_rnat_val sock ../../bpf/sock.c -- -I../../bpf/include -I/usr/include/x86_64-linux-gnu
//go:generate go tool bpf2go -go-package datapath -tags lace_ctv2 -output-stem pod_ctv2 -cc clang -cflags "-O2 -g -Wall -Werror" -target bpfel -type ep_key -type ep_val -type port_val -type route_key -type route_val -type net_val -type class_key -type ct_key -type ct_val -type snat_key -type snat_val -type snat_fail_val -type svc_key -type svc_val -type backend_key -type backend_val -type affinity_key -type affinity_val -type host_key -type lace_config -type pol_ep_val -type pol_peer_key -type pol_cidr_key -type pol_key -type pol_val -type flow_cfg pod ../../bpf/pod.c -- -DLACE_TEST_CT_V2 -I../../bpf/include -I/usr/include/x86_64-linux-gnu
//go:generate go tool bpf2go -go-package datapath -tags lace_ctv2 -output-stem underlay_ctv2 -cc clang -cflags "-O2 -g -Wall -Werror" -target bpfel underlay ../../bpf/underlay.c -- -DLACE_TEST_CT_V2 -I../../bpf/include -I/usr/include/x86_64-linux-gnu
