package images

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/lace-cni/lace/internal/fsutil"
)

// The annotations that name an image in an OCI layout's index.json.
// containerd (1.6 and 2.x, ctr import and the transfer service alike) takes
// the image name from AnnotationImageName first; other OCI tools read
// AnnotationRefName, which by the spec may hold a full reference.
const (
	AnnotationImageName = "io.containerd.image.name"
	AnnotationRefName   = "org.opencontainers.image.ref.name"
)

// WriteTarball writes img as an image tarball at path, named ref.
//
// The format is what `docker save` writes since Docker 25: an OCI image
// layout (oci-layout, index.json, blobs/sha256/...) whose index entry
// carries both name annotations, plus a Docker manifest.json with RepoTags
// pointing at the same blobs. containerd 1.6 and 2.x import it as an OCI
// layout whenever oci-layout is present, so the name comes from
// io.containerd.image.name, verbatim (the Docker path would normalize it,
// harmlessly for these fully qualified names); docker load, podman load and
// go-containerregistry's tarball reader use manifest.json. Entries are
// sorted with fixed times and owners: the same image gives the same bytes.
//
// The file is written beside path and renamed over it, so a reader never
// sees half a tarball and an interrupted build leaves the old one.
func WriteTarball(path, ref string, img v1.Image) error {
	desc := v1.Descriptor{
		Annotations: map[string]string{AnnotationImageName: ref, AnnotationRefName: ref},
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	desc.Platform = &v1.Platform{OS: cf.OS, Architecture: cf.Architecture}
	idx := mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: img, Descriptor: desc})
	index, err := idx.RawManifest()
	if err != nil {
		return fmt.Errorf("index: %w", err)
	}
	manifest, err := img.RawManifest()
	if err != nil {
		return fmt.Errorf("manifest: %w", err)
	}
	mdigest, err := img.Digest()
	if err != nil {
		return err
	}
	config, err := img.RawConfigFile()
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	cdigest, err := img.ConfigName()
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return fmt.Errorf("layers: %w", err)
	}

	type blob struct {
		digest v1.Hash
		size   int64
		open   func() (io.ReadCloser, error)
	}
	bytesBlob := func(h v1.Hash, b []byte) blob {
		return blob{h, int64(len(b)), func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }}
	}
	blobs := []blob{bytesBlob(mdigest, manifest), bytesBlob(cdigest, config)}
	docker := struct {
		Config   string
		RepoTags []string
		Layers   []string
	}{Config: blobPath(cdigest), RepoTags: []string{ref}}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return fmt.Errorf("layer digest: %w", err)
		}
		size, err := l.Size()
		if err != nil {
			return fmt.Errorf("layer size: %w", err)
		}
		blobs = append(blobs, blob{d, size, l.Compressed})
		docker.Layers = append(docker.Layers, blobPath(d))
	}
	sort.Slice(blobs, func(i, j int) bool { return blobs[i].digest.String() < blobs[j].digest.String() })
	dockerManifest, err := json.Marshal([]any{docker})
	if err != nil {
		return err
	}

	return fsutil.WriteAtomic(path, 0o644, func(f io.Writer) error {
		tw := tar.NewWriter(f)
		header := func(name string, size int64, dir bool) error {
			h := &tar.Header{Name: name, Size: size, Mode: 0o644, ModTime: Epoch, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
			if dir {
				h.Mode, h.Typeflag = 0o755, tar.TypeDir
			}
			return tw.WriteHeader(h)
		}
		small := func(name string, b []byte) error {
			if err := header(name, int64(len(b)), false); err != nil {
				return err
			}
			_, err := tw.Write(b)
			return err
		}
		if err := header("blobs/", 0, true); err != nil {
			return err
		}
		if err := header("blobs/sha256/", 0, true); err != nil {
			return err
		}
		written := map[v1.Hash]bool{}
		for _, b := range blobs {
			if written[b.digest] {
				continue
			}
			written[b.digest] = true
			if err := header(blobPath(b.digest), b.size, false); err != nil {
				return err
			}
			rc, err := b.open()
			if err != nil {
				return fmt.Errorf("blob %s: %w", b.digest, err)
			}
			n, err := io.Copy(tw, rc)
			rc.Close()
			if err != nil {
				return fmt.Errorf("blob %s: %w", b.digest, err)
			}
			if n != b.size {
				return fmt.Errorf("blob %s: wrote %d bytes, want %d", b.digest, n, b.size)
			}
		}
		if err := small("index.json", index); err != nil {
			return err
		}
		if err := small("manifest.json", dockerManifest); err != nil {
			return err
		}
		if err := small("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
			return err
		}
		return tw.Close()
	})
}

func blobPath(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

// ImageRefs returns the image names in an image tarball in the order they
// are listed: from index.json's annotations (io.containerd.image.name, else
// a full org.opencontainers.image.ref.name) when the tarball is an OCI
// layout, else from manifest.json's RepoTags.
func ImageRefs(tarPath string) ([]string, error) {
	f, err := os.Open(tarPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var index *v1.IndexManifest
	var docker []struct{ RepoTags []string }
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", tarPath, err)
		}
		switch filepath.Clean(hdr.Name) {
		case "index.json":
			if index, err = v1.ParseIndexManifest(io.LimitReader(tr, 16<<20)); err != nil {
				return nil, fmt.Errorf("%s: index.json: %w", tarPath, err)
			}
		case "manifest.json":
			if err := json.NewDecoder(io.LimitReader(tr, 16<<20)).Decode(&docker); err != nil {
				return nil, fmt.Errorf("%s: manifest.json: %w", tarPath, err)
			}
		}
	}
	var refs []string
	if index != nil {
		for _, m := range index.Manifests {
			if n := m.Annotations[AnnotationImageName]; n != "" {
				refs = append(refs, n)
			} else if n := m.Annotations[AnnotationRefName]; n != "" && isFullRef(n) {
				refs = append(refs, n)
			}
		}
		return refs, nil
	}
	for _, m := range docker {
		refs = append(refs, m.RepoTags...)
	}
	if refs == nil && docker == nil {
		return nil, fmt.Errorf("%s: neither index.json nor manifest.json: not an image tarball", tarPath)
	}
	return refs, nil
}

// isFullRef tells a full reference (repo:tag, host/repo@digest) from the
// bare tag an OCI ref.name usually holds, which names nothing on its own.
func isFullRef(s string) bool {
	for _, c := range s {
		if c == '/' || c == ':' || c == '@' {
			return true
		}
	}
	return false
}
