package controller

import (
	"context"
	"io"
	"log/slog"
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
	if err := WaitForAPIServer(ctx, &rest.Config{Host: srv.URL}, log); err != nil {
		t.Fatal(err)
	}
	if n := asked.Load(); n != 3 {
		t.Errorf("asked %d times, want 3 (two refused, one answered)", n)
	}

	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
	defer down.Close()
	ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := WaitForAPIServer(ctx, &rest.Config{Host: down.URL}, log); err == nil {
		t.Error("the API server never answered, yet the wait succeeded")
	}
}
