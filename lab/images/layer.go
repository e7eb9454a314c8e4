package images

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Epoch is the timestamp of every file, layer and image config: images built
// from the same inputs have the same digest.
var Epoch = time.Unix(0, 0).UTC()

// File is one entry of an image's filesystem.
type File struct {
	// Path inside the image; a leading slash is optional.
	Path string
	// Mode holds the permission bits (and the sticky bit as 0o1000); a
	// symlink always gets 0777.
	Mode int64
	// Dir makes a directory; Link a symlink to Link; otherwise a regular file
	// holding Data.
	Dir  bool
	Link string
	Data []byte
}

// NewImage returns a linux/GOARCH OCI image with one layer holding files and
// the given runtime config. Parent directories missing from files are added
// (0755); entries are sorted and owned by 0:0 with the mtime Epoch.
func NewImage(files []File, cfg v1.Config, arch string) (v1.Image, error) {
	layer, err := newLayer(files)
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{Created: v1.Time{Time: Epoch}, CreatedBy: "lace lab/mkimages"},
	})
	if err != nil {
		return nil, fmt.Errorf("append layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = arch
	cf.Created = v1.Time{Time: Epoch}
	cf.Config = cfg
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("set config: %w", err)
	}
	return img, nil
}

// newLayer writes files as a gzip-compressed tar once, in memory; the layer
// is small enough (the largest, Lace's, holds ~130 MB) and compressing only
// once keeps `make images` quick.
func newLayer(files []File) (v1.Layer, error) {
	entries := map[string]File{}
	for _, f := range files {
		name := strings.Trim(path.Clean("/"+f.Path), "/")
		if name == "" {
			return nil, fmt.Errorf("file %q: empty path", f.Path)
		}
		if _, dup := entries[name]; dup {
			return nil, fmt.Errorf("file %q: listed twice", f.Path)
		}
		f.Path = name
		entries[name] = f
		for dir := path.Dir(name); dir != "."; dir = path.Dir(dir) {
			if e, ok := entries[dir]; ok {
				if !e.Dir {
					return nil, fmt.Errorf("file %q: parent %q is not a directory", f.Path, dir)
				}
				continue
			}
			entries[dir] = File{Path: dir, Dir: true, Mode: 0o755}
		}
	}
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)

	var buf bytes.Buffer
	// Go's gzip writer leaves the header's name and mtime empty unless told:
	// the compressed bytes depend on the content only.
	zw, err := gzip.NewWriterLevel(&buf, gzip.DefaultCompression)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(zw)
	for _, n := range names {
		f := entries[n]
		hdr := &tar.Header{Name: n, Mode: f.Mode, ModTime: Epoch, Format: tar.FormatPAX}
		switch {
		case f.Dir:
			hdr.Typeflag, hdr.Name = tar.TypeDir, n+"/"
		case f.Link != "":
			// Linux ignores a symlink's mode; 0777 is what lstat shows.
			hdr.Typeflag, hdr.Linkname, hdr.Mode = tar.TypeSymlink, f.Link, 0o777
		default:
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(f.Data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("tar %s: %w", n, err)
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.Data); err != nil {
				return nil, fmt.Errorf("tar %s: %w", n, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	gz := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(gz)), nil
	}, tarball.WithMediaType(types.OCILayer))
}
