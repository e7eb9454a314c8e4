package controlplane

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// waitHTTP polls url until it answers 200, the process exits, or timeout.
func waitHTTP(ctx context.Context, url string, p *Process, timeout time.Duration) error {
	client := &http.Client{Timeout: 2 * time.Second}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if p.Exited() {
			return false, fmt.Errorf("%s %v: %s", p.Name, p.ExitError(), p.LogTail(2000))
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		return fmt.Errorf("wait for %s: %w", url, err)
	}
	return nil
}
