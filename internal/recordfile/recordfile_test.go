package recordfile

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"crust.dev/crust/api/safedir"
)

func TestRoundTripAndRefusals(t *testing.T) {
	payload := []byte(`{"a": [1, 2], "b":"x"}`) // spaces kept: the checksum is over the stored bytes
	rec, err := Encode(1, "boot-1", "thing", payload)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"version":1,"bootId":"boot-1","sha256":"`; !strings.HasPrefix(string(rec), want) {
		t.Fatalf("record %s does not start with %s", rec, want)
	}
	got, err := Decode(rec, 1, 1, "thing")
	if err != nil || got.Version != 1 || got.BootID != "boot-1" || !bytes.Equal(got.Payload, payload) {
		t.Fatalf("Decode = %+v, %v", got, err)
	}
	flip := bytes.Replace(rec, []byte(`"b":"x"`), []byte(`"b":"y"`), 1)
	for _, tc := range []struct {
		name, data, want string
	}{
		{"checksum", string(flip), "checksum mismatch"},
		{"truncated", string(rec[:len(rec)-5]), "not a JSON record"},
		{"trailing", string(rec) + "x", "not a JSON record"},
		{"older", strings.Replace(string(rec), `"version":1`, `"version":0`, 1), "invalid version"},
		{"no boot id", strings.Replace(string(rec), `"boot-1"`, `""`, 1), "empty bootId"},
		{"other field", string(rec), "no other"},
		{"too large", strings.Repeat(" ", MaxSize+1), "more than"},
	} {
		field := "thing"
		if tc.name == "other field" {
			field = "other"
		}
		if _, err := Decode([]byte(tc.data), 1, 1, field); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	if _, err := Decode(rec, 0, 0, "thing"); !errors.Is(err, ErrNewerVersion) {
		t.Errorf("a version 1 record read by version 0 code: %v, want ErrNewerVersion", err)
	}
	// Code that writes version 2 and still reads 1: the fast path is for its own version, the older one is
	// read as JSON, and one older than it reads is refused as damage.
	if got, err := Decode(rec, 1, 2, "thing"); err != nil || got.Version != 1 || !bytes.Equal(got.Payload, payload) {
		t.Errorf("a version 1 record read by code of versions 1 to 2: %+v, %v", got, err)
	}
	if _, err := Decode(rec, 2, 3, "thing"); err == nil || errors.Is(err, ErrNewerVersion) || !strings.Contains(err.Error(), "invalid version 1") {
		t.Errorf("a version 1 record read by code of versions 2 to 3: %v, want an invalid version", err)
	}
}

func TestWriteIsAtomicWithTheTempElsewhere(t *testing.T) {
	dir, tmp := t.TempDir(), t.TempDir()
	d, err := safedir.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = d.Close() }()
	td, err := safedir.Open(tmp)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = td.Close() }()
	for _, content := range []string{"one", "two"} {
		if err := Write(d, td, "r.json", []byte(content)); err != nil {
			t.Fatal(err)
		}
		got, err := Read(d, "r.json")
		if err != nil || string(got) != content {
			t.Fatalf("Read = %q, %v; want %q", got, err, content)
		}
	}
	fi, err := os.Stat(filepath.Join(dir, "r.json"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v; want 0600", fi.Mode(), err)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Fatalf("temp dir holds %v", left)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("record dir holds %v, want only r.json", entries)
	}
}

// FuzzDecode: any bytes decode or are refused without a panic, the same as a JSON parse of the whole
// record decides (the fast path for Encode's own layout agrees with it), by code that reads versions 1
// and 2, and what is accepted re-encodes to a record that decodes to the same version, boot id and
// payload.
func FuzzDecode(f *testing.F) {
	good, _ := Encode(1, "b", "p", []byte(`{"x":1}`))
	f.Add(good)
	newest, _ := Encode(2, "b", "p", []byte(`"eA=="`))
	f.Add(newest)
	f.Add([]byte(`{"version":2}`))
	f.Add([]byte(`{"version":3}`))
	f.Add([]byte(`{"version":1,"bootId":"b","sha256":"00","p":1}`))
	f.Add([]byte(`[]`))
	spaced, _ := Encode(1, "b", "p", []byte(`{"x": [1, 2]}`))
	f.Add(spaced)
	f.Add(append(bytes.TrimSuffix(good, []byte("}\n")), []byte(`,"p":2}`+"\n")...)) // a second payload member
	f.Add(bytes.Replace(good, []byte(`"b"`), []byte(`"\u0062"`), 1))                // an escaped boot id
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := Decode(data, 1, 2, "p")
		want, jerr := decodeJSON(data, 1, 2, "p")
		if (err == nil) != (jerr == nil) || got.Version != want.Version || got.BootID != want.BootID || !bytes.Equal(got.Payload, want.Payload) {
			t.Fatalf("Decode(%q) = %+v, %v; the JSON parse says %+v, %v", data, got, err, want, jerr)
		}
		if err != nil {
			return
		}
		again, err := Encode(got.Version, got.BootID, "p", got.Payload)
		if err != nil {
			t.Fatalf("accepted %q but cannot re-encode: %v", data, err)
		}
		if r, err := Decode(again, 1, 2, "p"); err != nil || r.Version != got.Version || r.BootID != got.BootID || !bytes.Equal(r.Payload, got.Payload) {
			t.Fatalf("round trip of %q: %+v %v", data, r, err)
		}
	})
}

func TestReadBootID(t *testing.T) {
	id, err := ReadBootID()
	if err != nil {
		t.Skipf("no boot id here: %v", err)
	}
	if id == "" || strings.TrimSpace(id) != id {
		t.Fatalf("boot id %q is empty or untrimmed", id)
	}
	if again, _ := ReadBootID(); again != id {
		t.Fatalf("boot id changed within a boot: %q, %q", id, again)
	}
}
