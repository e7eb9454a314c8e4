package controller

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// TestWaitForAPIServer: a controller started while the API server is out
// of reach waits for it (no exit, no crash loop) and goes on once it
// answers; a stop while waiting ends the wait with an error.
func TestWaitForAPIServer(t *testing.T) {
	var asked atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if asked.Add(1) < 3 {
			http.Error(w, "etcd is down", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte(`{"major":"1","minor":"34","gitVersion":"v1.34.4"}`))
	}))
	defer srv.Close()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := WaitForAPIServer(ctx, &rest.Config{Host: srv.URL}, "", log); err != nil {
		t.Fatal(err)
	}
	if n := asked.Load(); n != 3 {
		t.Errorf("asked %d times, want 3 (two refused, one answered)", n)
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
