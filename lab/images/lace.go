package images

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// BuildLace builds Lace's binaries from the source tree at srcDir (with
// the build tags given) as static executables and writes them as Lace's
// image, named ref, to tarball: another build than the running one, for
// an upgrade or a downgrade.
func BuildLace(ctx context.Context, srcDir string, tags []string, tarball, ref string) error {
	out, err := os.MkdirTemp("", "lace-build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(out)
	args := []string{"build", "-trimpath", "-ldflags", "-s -w", "-o", out + "/"}
	for _, t := range tags {
		args = append(args, "-tags", t)
	}
	for _, b := range LaceBinaries {
		args = append(args, "./cmd/"+b)
	}
	build := exec.CommandContext(ctx, "go", args...)
	build.Dir = srcDir
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if o, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build Lace in %s: %v\n%s", srcDir, err, o)
	}
	bins := map[string][]byte{}
	for _, b := range LaceBinaries {
		if bins[b], err = readStatic(filepath.Join(out, b)); err != nil {
			return err
		}
	}
	img, err := LaceImage(bins)
	if err != nil {
		return err
	}
	return WriteTarball(tarball, ref, img)
}
