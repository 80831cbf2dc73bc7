package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"crypto/sha256"
	"debug/elf"
	"debug/macho"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
)

// containerTool is the image builder make image uses: podman, else buildah; the test fails
// without either.
func containerTool(t *testing.T) string {
	t.Helper()
	for _, tool := range []string{"podman", "buildah"} {
		if p, err := exec.LookPath(tool); err == nil {
			return p
		}
	}
	t.Fatal("make image needs podman or buildah (Debian/Ubuntu: apt-get install buildah); .ci/run installs it")
	return ""
}

// ociImage is an image read from an OCI archive: its configuration and the files of its
// layers, extracted under root.
type ociImage struct {
	Config struct {
		User         string   `json:"User"`
		Env          []string `json:"Env"`
		Entrypoint   []string `json:"Entrypoint"`
		ExposedPorts map[string]struct{}
	} `json:"config"`
	files []string // regular files, paths relative to the root
}

// readOCIArchive extracts the image of an OCI archive (as `podman push IMAGE oci-archive:FILE`
// or buildah's writes it) into root.
func readOCIArchive(t *testing.T, archive, root string) ociImage {
	t.Helper()
	blobs := map[string][]byte{}
	f, err := os.Open(archive)
	require.NoError(t, err)
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			require.NoError(t, err)
			blobs[path.Clean(h.Name)] = b
		}
	}
	type descriptor struct {
		MediaType string `json:"mediaType"`
		Digest    string `json:"digest"`
	}
	blob := func(d descriptor) []byte {
		b, ok := blobs["blobs/"+strings.Replace(d.Digest, ":", "/", 1)]
		require.True(t, ok, "blob %s missing", d.Digest)
		return b
	}
	var index struct{ Manifests []descriptor }
	require.NoError(t, json.Unmarshal(blobs["index.json"], &index))
	require.Len(t, index.Manifests, 1)
	var manifest struct {
		Config descriptor
		Layers []descriptor
	}
	require.NoError(t, json.Unmarshal(blob(index.Manifests[0]), &manifest))
	var img ociImage
	require.NoError(t, json.Unmarshal(blob(manifest.Config), &img))
	for _, layer := range manifest.Layers {
		var r io.Reader = bytes.NewReader(blob(layer))
		if strings.HasSuffix(layer.MediaType, "+gzip") {
			zr, err := gzip.NewReader(r)
			require.NoError(t, err)
			r = zr
		}
		lr := tar.NewReader(r)
		for {
			h, err := lr.Next()
			if err == io.EOF {
				break
			}
			require.NoError(t, err)
			name := path.Clean(strings.TrimPrefix(h.Name, "/"))
			require.False(t, name == ".." || strings.HasPrefix(name, "../"), "layer entry %q", h.Name)
			switch h.Typeflag {
			case tar.TypeDir:
			case tar.TypeReg:
				dst := filepath.Join(root, filepath.FromSlash(name))
				require.NoError(t, os.MkdirAll(filepath.Dir(dst), 0o755))
				b, err := io.ReadAll(lr)
				require.NoError(t, err)
				require.NoError(t, os.WriteFile(dst, b, h.FileInfo().Mode().Perm()))
				img.files = append(img.files, name)
			default:
				t.Fatalf("layer entry %q of type %c: the image holds only regular files", h.Name, h.Typeflag)
			}
		}
	}
	slices.Sort(img.files)
	return img
}

// TestMakeImage: `make image` builds the image without any registry; its root filesystem holds
// the static binary and the CA certificates, nothing else; it runs as a user other than root;
// and the binary, run from the exported filesystem, serves /readyz on the test Postgres.
// (Containers themselves cannot run on the machines the tests run on.)
func TestMakeImage(t *testing.T) {
	t.Parallel()
	tool := containerTool(t)
	dir := repoCopy(t)
	var b [4]byte
	_, _ = rand.Read(b[:])
	image := "localhost/wsproxy-test-" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		_ = exec.Command(tool, "rmi", image+":"+testVersion, image+":latest").Run()
	})
	runIn(t, dir, "make", "image", "IMAGE="+image)
	archive := filepath.Join(t.TempDir(), "image.tar")
	runIn(t, dir, tool, "push", image+":"+testVersion, "oci-archive:"+archive)
	root := t.TempDir()
	img := readOCIArchive(t, archive, root)

	require.Equal(t, []string{"etc/ssl/certs/ca-certificates.crt", "wsproxy"}, img.files)
	certs, err := os.ReadFile(filepath.Join(root, "etc/ssl/certs/ca-certificates.crt"))
	require.NoError(t, err)
	require.Contains(t, string(certs), "-----BEGIN CERTIFICATE-----")
	require.Equal(t, "65532:65532", img.Config.User, "the image runs as a user other than root")
	require.Equal(t, []string{"/wsproxy"}, img.Config.Entrypoint)
	require.Contains(t, img.Config.Env, "LISTEN_ADDR=:8080", "in a container the proxy listens on every interface of its own network")
	require.Contains(t, img.Config.ExposedPorts, "8080/tcp")

	bin := filepath.Join(root, "wsproxy")
	requireStatic(t, bin)
	require.Equal(t, "wsproxy "+testVersion+"\n", runIn(t, root, bin, "version"))
	addr := freeAddr(t)
	cmd := exec.Command(bin)
	cmd.Env = []string{"DATABASE_URL=" + dbtest.SchemaURL(t), "LISTEN_ADDR=" + addr, "UPSTREAM_BASE_URL=demo", "ADMIN_TOKEN=test-admin-token-0123456789"}
	logs := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	deadline := time.Now().Add(time.Minute)
	for !ready(addr) {
		select {
		case <-exited:
			t.Fatalf("the image's binary exited:\n%s", logs.String())
		case <-time.After(100 * time.Millisecond):
		}
		require.True(t, time.Now().Before(deadline), "not ready after a minute:\n%s", logs.String())
	}
}

// TestMakeRelease: `make release` cross-builds one binary per platform, named by version, OS and
// architecture, each stamped with the version, with a SHA256SUMS file that checks them. (Two
// platforms here, a different system and architecture each; make release builds four.)
func TestMakeRelease(t *testing.T) {
	t.Parallel()
	dir := repoCopy(t)
	runIn(t, dir, "make", "release", "PLATFORMS=linux/amd64 darwin/arm64")
	dist := filepath.Join(dir, "dist")
	entries, err := os.ReadDir(dist)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	linux, darwin := "wsproxy-"+testVersion+"-linux-amd64", "wsproxy-"+testVersion+"-darwin-arm64"
	require.ElementsMatch(t, []string{linux, darwin, "SHA256SUMS"}, names)

	sums, err := os.ReadFile(filepath.Join(dist, "SHA256SUMS"))
	require.NoError(t, err)
	var want []string
	for _, name := range []string{darwin, linux} {
		b, err := os.ReadFile(filepath.Join(dist, name))
		require.NoError(t, err)
		require.Contains(t, string(b), testVersion, "%s is stamped with the version", name)
		sum := sha256.Sum256(b)
		want = append(want, fmt.Sprintf("%x  %s", sum, name))
	}
	require.Equal(t, strings.Join(want, "\n")+"\n", string(sums), "sha256sum -c reads it")

	f := requireStatic(t, filepath.Join(dist, linux))
	require.Equal(t, elf.EM_X86_64, f.Machine)
	m, err := macho.Open(filepath.Join(dist, darwin))
	require.NoError(t, err)
	defer m.Close()
	require.Equal(t, macho.CpuArm64, m.Cpu)
}
