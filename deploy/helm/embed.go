// Package helm carries Lace's Helm chart (deploy/helm/lace) inside the Go
// binaries that install it, so the lab installs exactly the chart in the
// tree, with the helm CLI, the way a user does.
package helm

import (
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// all: keeps files helm reads that go:embed would skip (.helmignore).
//
//go:embed all:lace
var files embed.FS

// Chart is the chart's directory tree: Chart.yaml at its root.
var Chart fs.FS = mustSub(files, "lace")

func mustSub(f fs.FS, dir string) fs.FS {
	s, err := fs.Sub(f, dir)
	if err != nil {
		panic(err)
	}
	return s
}

// WriteChart writes the chart to dir (created if missing) so that dir is a
// chart directory `helm install` accepts. Files already in dir are
// overwritten; files the chart does not have are left alone, so callers
// that want an exact copy remove dir first.
func WriteChart(dir string) error {
	return fs.WalkDir(Chart, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		dst := filepath.Join(dir, filepath.FromSlash(path))
		if d.IsDir() {
			if err := os.MkdirAll(dst, 0o755); err != nil {
				return fmt.Errorf("create %s: %w", dst, err)
			}
			return nil
		}
		b, err := fs.ReadFile(Chart, path)
		if err != nil {
			return err
		}
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", dst, err)
		}
		return nil
	})
}
