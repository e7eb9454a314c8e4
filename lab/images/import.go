package images

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"sort"
	"strings"
)

// Import loads the image tarball tarPath into the containerd at socket, in
// namespace (the CRI plugin's is "k8s.io"), with ctr (ctrBin; "" means ctr
// on PATH), and unpacks it into the default snapshotter: the CRI plugin only
// runs images unpacked for its snapshotter. The images keep the names the
// tarball gives them (see WriteTarball); importing an image that is already
// there is a no-op, and a name that pointed elsewhere is moved to the new
// image.
//
// retag then gives images further names, source reference -> new reference
// (the lab's `load --as`, an upgrade that rolls to a new tag). A new name
// that already exists is moved (ctr images tag --force), so Import is safe to
// repeat.
func Import(ctx context.Context, ctrBin, socket, namespace, tarPath string, retag map[string]string) error {
	if ctrBin == "" {
		ctrBin = "ctr"
	}
	ctr := func(args ...string) error {
		args = append([]string{"--address", socket, "--namespace", namespace}, args...)
		cmd := exec.CommandContext(ctx, ctrBin, args...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s %s: %w: %s", ctrBin, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
		}
		return nil
	}
	// --no-unpack=false is ctr's default, spelled out because the CRI
	// plugin depends on it; ctr 1.6 and 2.x both take it.
	if err := ctr("images", "import", "--no-unpack=false", tarPath); err != nil {
		return fmt.Errorf("import %s: %w", tarPath, err)
	}
	srcs := make([]string, 0, len(retag))
	for src := range retag {
		srcs = append(srcs, src)
	}
	sort.Strings(srcs)
	for _, src := range srcs {
		if err := ctr("images", "tag", "--force", src, retag[src]); err != nil {
			return fmt.Errorf("tag %s as %s: %w", src, retag[src], err)
		}
	}
	return nil
}
