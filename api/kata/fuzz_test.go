package kata

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
)

// FuzzParseMountInfo: decoding never panics, accepts only valid JSON, and what it accepts encodes to a
// form that decodes to the same value (so a Get after an Add reads what was meant).
func FuzzParseMountInfo(f *testing.F) {
	for _, s := range []string{
		`{"volume-type":"block","device":"/dev/sdf","fstype":"xfs","metadata":{"fsGroup":"4059"}}`,
		`{ "device" : "/dev/vdc", "volume-type": "block", "fstype": "ext4", "options": ["rw"] }`,
		`{"volume-type":"block","device":"/dev/sdh","fstype":"ext4","metadata":null,"options":null}`,
		`{"Device":"x","unknown":[1,2,{"a":null}]}`,
		`null`, `{}`, `[]`, `"x"`, `{"device":7}`, `{"options":["a",null]}`, "{\"device\":\"\xff\"}", ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		info, err := ParseMountInfo(data)
		if err != nil {
			if !errors.Is(err, ErrInvalidMountInfo) {
				t.Fatalf("error %v is not ErrInvalidMountInfo", err)
			}
			return
		}
		if !json.Valid(data) {
			t.Fatalf("accepted invalid JSON %q", data)
		}
		enc, err := json.Marshal(info)
		if err != nil {
			t.Fatal(err)
		}
		again, err := ParseMountInfo(enc)
		if err != nil {
			t.Fatalf("re-decoding %s: %v", enc, err)
		}
		enc2, _ := json.Marshal(again)
		if !bytes.Equal(enc, enc2) {
			t.Fatalf("not stable:\n%s\n%s", enc, enc2)
		}
	})
}

// FuzzParseVolumeDirName: a name is accepted only when it is the one directory name of its path.
func FuzzParseVolumeDirName(f *testing.F) {
	for _, s := range []string{"L2E=", "L2Fi", "L2FiYw==", "cmVsYXRpdmUvcGF0aA==", "L2I", "L2F=", "L2E=\n",
		"", "====", ".crust-tmp", "a+b/", "L3Zhci9saWIva3ViZWxldC9wb2RzL3gvdm9sdW1lcy9rdWJlcm5ldGVzLmlvfmNzaS8_Pz8-Pj5-fn4vbW91bnQ="} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		path, err := ParseVolumeDirName(name)
		if err != nil {
			if !errors.Is(err, ErrInvalidDirName) {
				t.Fatalf("error %v is not ErrInvalidDirName", err)
			}
			return
		}
		if path == "" || VolumeDirName(path) != name {
			t.Fatalf("%q decodes to %q, which encodes to %q", name, path, VolumeDirName(path))
		}
	})
}

// FuzzVolumeDirName: every non-empty path has a name that decodes back to it and is never a dot-name.
func FuzzVolumeDirName(f *testing.F) {
	for _, s := range []string{"/a", "relative/path", "/x/ünïcödé-卷", "/???>>>~~~", "\x00", "\xff\xfe"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, path string) {
		if path == "" {
			return
		}
		name := VolumeDirName(path)
		if name[0] == '.' {
			t.Fatalf("%q has the dot-name %q", path, name)
		}
		got, err := ParseVolumeDirName(name)
		if err != nil || got != path {
			t.Fatalf("%q -> %q -> %q, %v", path, name, got, err)
		}
	})
}
