package directvolume

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"crust.dev/crust/api/kata"
	"crust.dev/crust/api/kata/katatest"
)

// TestStatsAndResize: stats and resize find the first sandbox id and the device, and ask its shim.
func TestStatsAndResize(t *testing.T) {
	dir := t.TempDir()
	goDir, rsDir := katatest.ShimDirs(t)
	const vol, dev = "/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv/mount", "/dev/mapper/vg-lv 1"
	mustRun(t, "add", "--kata-dir", dir, "--volume-path", vol, "--mount-info",
		`{"volume-type":"directvol","device":"/dev/mapper/vg-lv 1","fstype":"ext4"}`)
	for _, id := range []string{"sb-b", "sb-a"} { // Kata takes the first in name order
		if err := katatest.RecordSandbox(dir, vol, id); err != nil {
			t.Fatal(err)
		}
	}
	var resized []string
	shim := (&katatest.Shim{
		Stats: func(device string) (*katatest.VolumeStats, error) {
			if device != dev {
				return nil, errors.New("unknown device " + device)
			}
			return &katatest.VolumeStats{Usage: []katatest.VolumeUsage{
				{Available: 1032192, Total: 1064960, Used: 32768, Unit: 1}, {Total: 65536, Unit: 2},
			}}, nil
		},
		Resize: func(device string, size uint64) error {
			resized = append(resized, device)
			if size > 1<<40 {
				return errors.New("guest: no room for that")
			}
			return nil
		},
	}).Start(t, katatest.ShimSocket(rsDir, "sb-a"))
	other := (&katatest.Shim{}).Start(t, katatest.ShimSocket(goDir, "sb-b"))
	shimDirs := goDir + "," + rsDir

	out := mustRun(t, "stats", "--kata-dir", dir, "--volume-path", vol, "--kata-shim-dirs", shimDirs)
	if want := `{"usage":[{"available":1032192,"total":1064960,"used":32768,"unit":1},{"total":65536,"unit":2}]}` + "\n"; out != want {
		t.Errorf("stats printed %q, want %q", out, want)
	}
	if reqs := shim.Requests(); len(reqs) != 1 || reqs[0].RawQuery != "path=%2Fdev%2Fmapper%2Fvg-lv%201" {
		t.Errorf("shim got %+v", reqs)
	}

	if out := mustRun(t, "resize", "--kata-dir", dir, "--volume-path", vol, "--size", "2147483648", "--kata-shim-dirs", shimDirs); out != "" {
		t.Errorf("resize printed %q", out)
	}
	if reqs := shim.Requests(); len(reqs) != 2 || string(reqs[1].Body) != `{"VolumePath":"/dev/mapper/vg-lv 1","Size":2147483648}` {
		t.Errorf("shim got %+v", reqs)
	}
	_, err := run(t, "resize", "--kata-dir", dir, "--volume-path", vol, "--size", "2199023255553", "--kata-shim-dirs", shimDirs)
	var se *kata.ShimError
	if !errors.As(err, &se) || se.Status != 500 || !strings.Contains(err.Error(), "guest: no room for that") {
		t.Errorf("failed resize: %v", err)
	}
	if !slices.Equal(resized, []string{dev, dev}) {
		t.Errorf("resized %q", resized)
	}
	if len(other.Requests()) != 0 {
		t.Errorf("the second sandbox's shim was asked: %+v", other.Requests())
	}

	// A real Kata today: resize is unimplemented, and the error says so.
	shim.Close()
	(&katatest.Shim{}).Start(t, katatest.ShimSocket(rsDir, "sb-a"))
	if _, err := run(t, "resize", "--kata-dir", dir, "--volume-path", vol, "--size", "1", "--kata-shim-dirs", shimDirs); err == nil ||
		!strings.Contains(err.Error(), katatest.UnimplementedText) {
		t.Errorf("resize against Kata: %v", err)
	}

	// No shim answers.
	if _, err := run(t, "stats", "--kata-dir", dir, "--volume-path", vol, "--kata-shim-dirs", filepath.Join(filepath.Dir(goDir), "none")); !errors.Is(err, kata.ErrShimUnreachable) {
		t.Errorf("stats with no shim: %v", err)
	}
}

func TestStatsAndResizeErrors(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, "add", "--kata-dir", dir, "--volume-path", "/unused", "--mount-info", `{"device":"/dev/a"}`)
	for _, tc := range []struct {
		args   []string
		prefix string
	}{
		{[]string{"stats"}, "--volume-path: required"},
		{[]string{"stats", "--volume-path", "/missing"}, "--volume-path: direct volume \"/missing\": not found"},
		{[]string{"stats", "--volume-path", "/unused"}, "--volume-path: direct volume \"/unused\" is used by no sandbox"},
		{[]string{"resize", "--volume-path", "/unused"}, "--size: required"},
		{[]string{"resize", "--volume-path", "/unused", "--size", "0"}, "--size: must be positive"},
		{[]string{"resize", "--volume-path", "/unused", "--size", "1"}, "--volume-path: direct volume \"/unused\" is used by no sandbox"},
		{[]string{"stats", "--kata-dir", "", "--volume-path", "/unused"}, "--kata-dir: required"},
	} {
		args := append([]string{"--kata-dir", dir}, tc.args...)
		_, err := run(t, args...)
		if err == nil || !strings.HasPrefix(err.Error(), tc.prefix) {
			t.Errorf("%q: %v, want an error starting %q", tc.args, err, tc.prefix)
		}
	}
	// A volume directory without mountInfo.json, holding only a sandbox id, is not found.
	if err := os.MkdirAll(filepath.Join(dir, kata.VolumeDirName("/half")), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, kata.VolumeDirName("/half"), "sb"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "stats", "--kata-dir", dir, "--volume-path", "/half"); !errors.Is(err, kata.ErrNotFound) {
		t.Errorf("stats of a volume without mount info: %v", err)
	}
}

func TestShimFlagDefaults(t *testing.T) {
	for _, name := range []string{"stats", "resize"} {
		cmd, _, err := NewCommand().Find([]string{name})
		if err != nil {
			t.Fatal(err)
		}
		if got := cmd.Flags().Lookup("kata-shim-dirs").DefValue; got != "["+katatest.GoShimDir+","+katatest.RustShimDir+"]" {
			t.Errorf("%s --kata-shim-dirs defaults to %s", name, got)
		}
	}
}
