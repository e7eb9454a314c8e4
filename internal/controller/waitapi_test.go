package controller

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/lace-cni/lace/pkg/scheme"
)

// TestWaitForAPIServer: a controller started while the API server is out
// of reach waits for it (no exit, no crash loop) and goes on once it
// answers; a stop while waiting ends the wait with an error.
func TestWaitForAPIServer(t *testing.T) {
	var asked, listed atomic.Int32
	crds := servedCRDs(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/version" {
			if asked.Add(1) < 3 {
				http.Error(w, "etcd is down", http.StatusServiceUnavailable)
				return
			}
			_, _ = w.Write([]byte(`{"major":"1","minor":"34","gitVersion":"v1.34.4"}`))
			return
		}
		// A restarted API server answers /version before its CRD
		// handler serves the CRDs' group versions.
		if r.URL.Path == "/apis/lace-cni.io/v1alpha1" && listed.Add(1) < 3 {
			http.NotFound(w, r)
			return
		}
		serveList(w, r, crds, "")
	}))
	defer srv.Close()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := WaitForAPIServer(ctx, &rest.Config{Host: srv.URL}, "", log); err != nil {
		t.Fatal(err)
	}
	if n := asked.Load(); n != 5 {
		t.Errorf("asked /version %d times, want 5 (two refused, three answered)", n)
	}
	if n := listed.Load(); n != 3 {
		t.Errorf("asked for lace-cni.io/v1alpha1 %d times, want 3 (two not found, one served)", n)
	}

	// A group version served without one of its kinds (a CRD not
	// installed, or not synced yet) is waited for too.
	partial := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/version" {
			_, _ = w.Write([]byte(`{"major":"1","minor":"34","gitVersion":"v1.34.4"}`))
			return
		}
		serveList(w, r, crds, "NetworkEndpoint")
	}))
	defer partial.Close()
	ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := WaitForAPIServer(ctx, &rest.Config{Host: partial.URL}, "", log)
	if err == nil || !strings.Contains(err.Error(), "does not serve NetworkEndpoint yet") {
		t.Errorf("a missing NetworkEndpoint kind: %v, want a wait ended by its context naming it", err)
	}

	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
	defer down.Close()
	// While it waits, the kubelet's probes find it alive and not ready.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	health := ln.Addr().String()
	ln.Close()
	ctx, cancel = context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- WaitForAPIServer(ctx, &rest.Config{Host: down.URL}, health, log) }()
	probe := func(path string) int {
		for range 50 {
			if resp, err := http.Get("http://" + health + path); err == nil {
				resp.Body.Close()
				return resp.StatusCode
			}
			time.Sleep(20 * time.Millisecond)
		}
		return 0
	}
	if c := probe("/healthz"); c != http.StatusOK {
		t.Errorf("/healthz while waiting: %d, want 200", c)
	}
	if c := probe("/readyz"); c == http.StatusOK {
		t.Error("/readyz answered 200 while waiting for the API server")
	}
	if err := <-done; err == nil {
		t.Error("the API server never answered, yet the wait succeeded")
	}
	// The manager binds the same address next.
	ln, err = net.Listen("tcp", health)
	if err != nil {
		t.Errorf("the health address is still held after the wait: %v", err)
	} else {
		ln.Close()
	}
}

// servedCRDs is what discovery lists for each CRD group version: every
// resource kind the scheme knows there.
func servedCRDs(t *testing.T) map[string][]string {
	out := map[string][]string{}
	for _, gv := range crdGroupVersions {
		for kind, typ := range scheme.Scheme.KnownTypes(gv) {
			if !strings.HasSuffix(kind, "List") && reflect.PointerTo(typ).Implements(objectType) {
				out["/apis/"+gv.String()] = append(out["/apis/"+gv.String()], kind)
			}
		}
	}
	if len(out["/apis/lace-cni.io/v1alpha1"]) < 10 {
		t.Fatalf("the scheme knows only %v of lace-cni.io/v1alpha1", out["/apis/lace-cni.io/v1alpha1"])
	}
	return out
}

// serveList answers a discovery request for a CRD group version with its
// kinds, leaving out the kind named by without.
func serveList(w http.ResponseWriter, r *http.Request, crds map[string][]string, without string) {
	kinds, ok := crds[r.URL.Path]
	if !ok {
		http.NotFound(w, r)
		return
	}
	list := metav1.APIResourceList{GroupVersion: strings.TrimPrefix(r.URL.Path, "/apis/")}
	for _, k := range kinds {
		if k != without {
			list.APIResources = append(list.APIResources, metav1.APIResource{Name: strings.ToLower(k) + "s", Kind: k, Namespaced: true})
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(list)
}
