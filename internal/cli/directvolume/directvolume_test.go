package directvolume

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"crust.dev/crust/api/kata"
	"crust.dev/crust/api/kata/katatest"
	"crust.dev/crust/api/safedir/safedirtest"
)

// readBack is what get and list print of the vector: what Kata reads back, with the value of an
// encryptionKey replaced by "<redacted>" (the key is secret, and printed output never shows it).
func readBack(t *testing.T, v katatest.Vector) *kata.MountInfo {
	t.Helper()
	info := katatest.ReadBack[kata.MountInfo](t, v)
	if _, ok := info.Metadata[kata.MetadataEncryptionKey]; ok {
		info.Metadata[kata.MetadataEncryptionKey] = "<redacted>"
	}
	return info
}

// run executes the command in-process, as crustctl would, and returns what it printed.
func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := NewCommand()
	var out, stderr bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&stderr)
	cmd.SetArgs(args)
	err := cmd.Execute()
	if stderr.Len() > 0 {
		t.Errorf("wrote to stderr: %s", stderr.String())
	}
	return out.String(), err
}

func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	out, err := run(t, args...)
	if err != nil {
		t.Fatalf("%q: %v", args, err)
	}
	return out
}

// TestVectors: for every vector, add lays down Kata's files, get reads back what Kata reads, and remove
// deletes the volume with its sandbox file.
func TestVectors(t *testing.T) {
	vectors := katatest.Load(t)
	dir := t.TempDir()
	for _, v := range vectors {
		t.Run(v.Dir, func(t *testing.T) {
			mustRun(t, "--kata-dir", dir, "add", "--volume-path", v.VolumePath, "--mount-info", katatest.Input[kata.MountInfo](t, v))
			if v.SandboxID != "" {
				if err := katatest.RecordSandbox(dir, v.VolumePath, v.SandboxID); err != nil {
					t.Fatal(err)
				}
			}
			assertFiles(t, filepath.Join(dir, v.Dir), v.Files)

			wantIDs := []string{}
			if v.SandboxRead != "" {
				wantIDs = []string{v.SandboxRead}
			}
			for _, format := range []string{"", "json", "yaml"} {
				args := []string{"get", "--kata-dir", dir, "--volume-path", v.VolumePath}
				if format != "" {
					args = append(args, "-o", format)
				}
				var got view
				if err := yaml.Unmarshal([]byte(mustRun(t, args...)), &got); err != nil { // YAML is a superset of JSON
					t.Fatal(err)
				}
				if got.VolumePath != v.VolumePath || !slices.Equal(got.SandboxIDs, wantIDs) ||
					katatest.MustJSON(t, got.MountInfo) != katatest.MustJSON(t, readBack(t, v)) {
					t.Errorf("get -o %q = %+v, want %s and sandboxes %q", format, got, katatest.MustJSON(t, readBack(t, v)), wantIDs)
				}
			}
			table := mustRun(t, "get", "--kata-dir", dir, "--volume-path", v.VolumePath, "-o", "table")
			if !strings.Contains(table, v.VolumePath) || !strings.Contains(table, readBack(t, v).Device) {
				t.Errorf("get -o table:\n%s", table)
			}
		})
	}

	// list shows them all, in path order.
	var listed []view
	if err := json.Unmarshal([]byte(mustRun(t, "list", "--kata-dir", dir, "-o", "json")), &listed); err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, v := range vectors {
		want = append(want, v.VolumePath)
	}
	slices.Sort(want)
	var got []string
	for _, l := range listed {
		got = append(got, l.VolumePath)
	}
	if !slices.Equal(got, want) {
		t.Errorf("list paths %q, want %q", got, want)
	}
	table := strings.Split(strings.TrimSpace(mustRun(t, "list", "--kata-dir", dir)), "\n")
	if len(table) != len(vectors)+1 || !strings.HasPrefix(table[0], "VOLUME PATH") {
		t.Errorf("list table:\n%s", strings.Join(table, "\n"))
	}

	for _, v := range vectors {
		for range 2 { // removing what is gone is not an error
			mustRun(t, "remove", "--kata-dir", dir, "--volume-path", v.VolumePath)
		}
		if _, err := os.Stat(filepath.Join(dir, v.Dir)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still there: %v", v.Dir, err)
		}
		if _, err := run(t, "get", "--kata-dir", dir, "--volume-path", v.VolumePath); !errors.Is(err, kata.ErrNotFound) ||
			!strings.HasPrefix(err.Error(), "--volume-path: ") {
			t.Errorf("get after remove: %v", err)
		}
	}
	if out := mustRun(t, "list", "--kata-dir", dir, "-o", "json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("list of nothing: %s", out)
	}
}

// assertFiles checks that volDir (mode 0700) holds exactly files, each mode 0600, byte for byte.
func assertFiles(t *testing.T, volDir string, files map[string]string) {
	t.Helper()
	fi, err := os.Stat(volDir)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("%s mode %v", volDir, fi.Mode())
	}
	entries, err := os.ReadDir(volDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(files) {
		t.Errorf("%d entries, want %d", len(entries), len(files))
	}
	for _, e := range entries {
		want, ok := files[e.Name()]
		b, err := os.ReadFile(filepath.Join(volDir, e.Name()))
		if !ok || err != nil || string(b) != want {
			t.Errorf("%s = %q (%v), want %q", e.Name(), b, err, want)
		}
		if fi, _ := e.Info(); fi.Mode() != 0o600 {
			t.Errorf("%s mode %v", e.Name(), fi.Mode())
		}
	}
}

func TestAddKeepsSandboxes(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, "add", "--kata-dir", dir, "--volume-path", "/v", "--mount-info", `{"device":"/dev/a"}`)
	if err := katatest.RecordSandbox(dir, "/v", "sb"); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "add", "--kata-dir", dir, "--volume-path", "/v", "--mount-info", `{"device":"/dev/b"}`)
	assertFiles(t, filepath.Join(dir, kata.VolumeDirName("/v")), map[string]string{
		kata.MountInfoFileName: `{"device":"/dev/b"}`, "sb": "",
	})
}

func TestErrorsNameTheFlag(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args   []string
		prefix string
	}{
		{[]string{"add", "--mount-info", "{}"}, "--volume-path: required"},
		{[]string{"add", "--volume-path", "/v"}, "--mount-info: required"},
		{[]string{"add", "--volume-path", "/v", "--mount-info", "{"}, "--mount-info: invalid mount info"},
		{[]string{"add", "--volume-path", "/v", "--mount-info", `{"options":"ro"}`}, "--mount-info: invalid mount info"},
		{[]string{"add", "--volume-path", "/" + strings.Repeat("a", 200), "--mount-info", "{}"}, "--volume-path: invalid volume path"},
		// kubelet's target path of a PersistentVolume named with 253 characters: crustd holds such a volume,
		// but Kata cannot name it, and neither can this drop-in for kata-runtime.
		{[]string{"add", "--volume-path", "/var/lib/kubelet/pods/0e0e0e0e-0000-4000-8000-000000000001/volumes/kubernetes.io~csi/" +
			strings.Repeat("p", 253) + "/mount", "--mount-info", "{}"}, "--volume-path: invalid volume path: 344 bytes, longer than 189"},
		{[]string{"remove"}, "--volume-path: required"},
		{[]string{"get"}, "--volume-path: required"},
		{[]string{"get", "--volume-path", "/missing"}, "--volume-path: "},
		{[]string{"list", "-o", "xml"}, "--output: "},
		{[]string{"list", "--kata-dir", ""}, "--kata-dir: required"},
		{[]string{"add", "--kata-dir", "", "--volume-path", "/v", "--mount-info", "{}"}, "--kata-dir: required"},
	} {
		args := append([]string{"--kata-dir", dir}, tc.args...)
		_, err := run(t, args...)
		if err == nil || !strings.HasPrefix(err.Error(), tc.prefix) {
			t.Errorf("%q: %v, want an error starting %q", tc.args, err, tc.prefix)
		}
	}
	// A refused add creates nothing.
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("refused commands left %v", entries)
	}
}

func TestDefaults(t *testing.T) {
	cmd := NewCommand()
	if got := cmd.PersistentFlags().Lookup("kata-dir").DefValue; got != kata.DefaultDir {
		t.Errorf("--kata-dir defaults to %q", got)
	}
	var names []string
	for _, c := range cmd.Commands() {
		names = append(names, c.Name())
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"add", "get", "list", "remove", "resize", "stats"}) {
		t.Errorf("subcommands %q", names)
	}
}

// TestUnderCrustctl: mounted under a root that has its own global -o, as crustctl has, the command's -o
// wins and nothing clashes.
func TestUnderCrustctl(t *testing.T) {
	dir := t.TempDir()
	root := &cobra.Command{Use: "crustctl", SilenceErrors: true, SilenceUsage: true}
	global := root.PersistentFlags().StringP("output", "o", "", "")
	root.AddCommand(NewCommand())
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"direct-volume", "--kata-dir", dir, "list", "-o", "json"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(out.String()) != "[]" || *global != "" {
		t.Fatalf("printed %q, global -o %q", out.String(), *global)
	}
}

// TestPlantedLink: a link planted at a volume directory's place is refused by add and get, blamed on
// --kata-dir, and remove takes the link itself away; nothing is written, read or removed where it points.
func TestPlantedLink(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, kata.MountInfoFileName), []byte(`{"device":"/dev/planted"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, kata.VolumeDirName("/v"))); err != nil {
		t.Fatal(err)
	}
	before := safedirtest.Snapshot(t, outside)
	for _, args := range [][]string{
		{"add", "--volume-path", "/v", "--mount-info", `{"device":"/dev/a"}`},
		{"get", "--volume-path", "/v"},
	} {
		out, err := run(t, append([]string{"--kata-dir", dir}, args...)...)
		if !errors.Is(err, kata.ErrForeignEntry) || !strings.HasPrefix(err.Error(), "--kata-dir: ") || out != "" {
			t.Errorf("%q: %q, %v; want a --kata-dir error wrapping ErrForeignEntry", args, out, err)
		}
	}
	if out := mustRun(t, "--kata-dir", dir, "list", "-o", "json"); strings.Contains(out, "planted") {
		t.Errorf("list read through the link: %s", out)
	}
	mustRun(t, "--kata-dir", dir, "remove", "--volume-path", "/v")
	if _, err := os.Lstat(filepath.Join(dir, kata.VolumeDirName("/v"))); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("remove left the link: %v", err)
	}
	safedirtest.Unchanged(t, before, outside)
}

// Entries of every block volume type Kata's runtimes and their tools write are added and read back as
// they are: "blk" beside the vectors' "block" and "directvol".
func TestBlkVolumeType(t *testing.T) {
	dir := t.TempDir()
	vp := "/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/blk/mount"
	mustRun(t, "--kata-dir", dir, "add", "--volume-path", vp, "--mount-info",
		`{"volume-type":"blk","device":"/dev/vdd","fstype":"ext4","metadata":{"encryptionKey":"ephemeral"}}`)
	var got view
	if err := json.Unmarshal([]byte(mustRun(t, "get", "--kata-dir", dir, "--volume-path", vp, "-o", "json")), &got); err != nil {
		t.Fatal(err)
	}
	if got.MountInfo.VolumeType != kata.VolumeTypeBlk || got.MountInfo.Device != "/dev/vdd" ||
		got.MountInfo.Metadata[kata.MetadataEncryptionKey] != "<redacted>" {
		t.Errorf("get = %+v, want volume-type blk, /dev/vdd and the key redacted", got)
	}
	if table := mustRun(t, "list", "--kata-dir", dir); !strings.Contains(table, "blk") {
		t.Errorf("list does not show the type:\n%s", table)
	}
}
