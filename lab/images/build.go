package images

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Options are the inputs of Build.
type Options struct {
	// Out is the directory the tarballs go to (created if missing).
	Out string
	// Agnhost is a static agnhost binary (CGO_ENABLED=0).
	Agnhost string
	// Busybox is a static busybox (Debian busybox-static: /bin/busybox).
	Busybox string
	// BashStatic is a static bash (Debian bash-static: /bin/bash-static),
	// the busybox image's /bin/sh (BuildE2E; e2eMoreImages says why).
	BashStatic string
	// PauseSrc is the directory holding upstream's pause.c
	// (k8s.io/kubernetes build/pause/linux).
	PauseSrc string
	// LaceBin is the directory holding Lace's static binaries.
	LaceBin string
	// LaceTag is the tag of Lace's image.
	LaceTag string
	// CoreDNS is a static coredns binary (BuildCoreDNS; BuildE2E puts it
	// into the e2e agnhost image as /coredns, as upstream's has one).
	CoreDNS string
	// K8sSrc is the pinned k8s.io/kubernetes module's directory (BuildE2E:
	// pause.c, the kitten and nautilus pages).
	K8sSrc string
	// E2EBin holds the static regression-issue-74839 and nonewprivs
	// (BuildE2E; make e2e-image-bins).
	E2EBin string
}

// Built is one image tarball Build wrote.
type Built struct {
	Ref    string
	Path   string
	Digest v1.Hash // of the image manifest
	Size   int64   // of the tarball, bytes
}

// Tarball names inside Options.Out.
const (
	AgnhostTar = "agnhost.tar"
	PauseTar   = "pause.tar"
	LaceTar    = "lace.tar"
)

// Build checks that every input binary is static, builds the three images
// and writes agnhost.tar, pause.tar and lace.tar into o.Out, replacing
// earlier ones.
func Build(ctx context.Context, o Options) ([]Built, error) {
	if o.LaceTag == "" {
		o.LaceTag = "dev"
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, err
	}
	var built []Built
	write := func(name, ref string, img v1.Image, err error) error {
		if err != nil {
			return fmt.Errorf("%s: %w", ref, err)
		}
		p := filepath.Join(o.Out, name)
		if err := WriteTarball(p, ref, img); err != nil {
			return fmt.Errorf("write %s: %w", p, err)
		}
		d, err := img.Digest()
		if err != nil {
			return err
		}
		st, err := os.Stat(p)
		if err != nil {
			return err
		}
		built = append(built, Built{Ref: ref, Path: p, Digest: d, Size: st.Size()})
		return nil
	}

	// agnhost
	agnhost, err := readStatic(o.Agnhost)
	if err != nil {
		return nil, err
	}
	busybox, err := readStatic(o.Busybox)
	if err != nil {
		return nil, err
	}
	applets, err := BusyboxApplets(ctx, o.Busybox)
	if err != nil {
		return nil, err
	}
	img, err := AgnhostImage(agnhost, busybox, applets)
	if err := write(AgnhostTar, AgnhostRef, img, err); err != nil {
		return nil, err
	}

	// pause
	tmp, err := os.MkdirTemp("", "lace-pause-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	pauseBin := filepath.Join(tmp, "pause")
	if err := CompilePause(ctx, o.PauseSrc, pauseBin); err != nil {
		return nil, err
	}
	pause, err := readStatic(pauseBin)
	if err != nil {
		return nil, err
	}
	img, err = PauseImage(pause)
	if err := write(PauseTar, PauseRef, img, err); err != nil {
		return nil, err
	}

	// lace
	bins := map[string][]byte{}
	for _, b := range LaceBinaries {
		if bins[b], err = readStatic(filepath.Join(o.LaceBin, b)); err != nil {
			return nil, err
		}
	}
	img, err = LaceImage(bins)
	if err := write(LaceTar, LaceRef(o.LaceTag), img, err); err != nil {
		return nil, err
	}
	return built, nil
}

func readStatic(path string) ([]byte, error) {
	if err := CheckStatic(path); err != nil {
		return nil, err
	}
	return os.ReadFile(path)
}
