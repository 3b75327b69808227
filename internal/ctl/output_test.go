package ctl

import (
	"bytes"
	"strings"
	"testing"

	crustv1 "crust.dev/crust/api/crust/v1"
)

func TestPrintEvent(t *testing.T) {
	events := []*crustv1.WatchVolumesResponse{
		{Type: crustv1.EventType_EVENT_TYPE_SYNCED, Revision: 4},
		{Type: crustv1.EventType_EVENT_TYPE_SYNCED, Revision: 4, Resumed: true},
		{Type: crustv1.EventType_EVENT_TYPE_CLAIMED, Revision: 5, Volume: &crustv1.Volume{
			Spec:  &crustv1.VolumeSpec{VolumeTargetPath: "/t", VolumeBackingPath: "/dev/loop1"},
			Claim: &crustv1.Claim{SandboxId: "sb"}}},
		{Type: crustv1.EventType_EVENT_TYPE_RELEASED, Revision: 6, ReleaseReason: crustv1.ReleaseReason_RELEASE_REASON_HANDLER_GONE,
			ReleasedClaim: &crustv1.Claim{SandboxId: "sb"}, Detail: "gone",
			Volume: &crustv1.Volume{Spec: &crustv1.VolumeSpec{VolumeTargetPath: "/t", VolumeBackingPath: "/dev/loop1"}}},
	}
	for _, tc := range []struct {
		output string
		want   []string // the lines, fields joined by one space
	}{
		{"", []string{`{"type":"EVENT_TYPE_SYNCED","revision":"4"}`, `{"type":"EVENT_TYPE_SYNCED","revision":"4","resumed":true}`,
			`{"type":"EVENT_TYPE_CLAIMED",`, `{"type":"EVENT_TYPE_RELEASED",`}},
		{"json", []string{`{"type":"EVENT_TYPE_SYNCED","revision":"4"}`, `{"type":"EVENT_TYPE_SYNCED","revision":"4","resumed":true}`,
			`{"type":"EVENT_TYPE_CLAIMED",`, `{"type":"EVENT_TYPE_RELEASED",`}},
		{"table", []string{"REVISION EVENT TARGET SANDBOX DETAIL", "4 synced - - -", "4 synced - - resumed", "5 claimed /t sb -",
			"6 released /t sb gone"}},
		{"wide", []string{"REVISION EVENT TARGET SANDBOX DETAIL DEVICE RELEASED BY", "4 synced - - - - -", "4 synced - - resumed - -",
			"5 claimed /t sb - /dev/loop1 -", "6 released /t sb gone /dev/loop1 handler_gone"}},
		{"yaml", []string{"---", "revision: \"4\"", "type: EVENT_TYPE_SYNCED", "---"}},
	} {
		t.Run(tc.output, func(t *testing.T) {
			g := &globals{output: tc.output}
			if err := g.checkOutput(); err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			header := false
			for _, ev := range events {
				if err := g.printEvent(&buf, ev, &header); err != nil {
					t.Fatal(err)
				}
			}
			lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
			for i, w := range tc.want {
				if i >= len(lines) {
					t.Fatalf("%d lines, want at least %d:\n%s", len(lines), len(tc.want), buf.String())
				}
				got := strings.Join(strings.Fields(lines[i]), " ")
				if strings.HasPrefix(got, "{") {
					got = strings.ReplaceAll(got, " ", "") // protojson varies its spaces on purpose
				}
				if !strings.HasPrefix(got, w) {
					t.Errorf("line %d: %q, want %q", i, got, w)
				}
			}
		})
	}
	if err := (&globals{output: "xml"}).checkOutput(); err == nil || !strings.Contains(err.Error(), `"xml"`) {
		t.Errorf("-o xml: %v", err)
	}
}

func TestInfoRows(t *testing.T) {
	r := &crustv1.GetInfoResponse{Version: "v0.2.0", Revision: "abc", ApiVersions: []string{"crust.v1"},
		Features: []string{"raw-block", "watch-resume"}}
	for _, tc := range []struct {
		output string
		want   []string
	}{
		{"", []string{"VERSION REVISION API FEATURES", "v0.2.0 abc crust.v1 raw-block,watch-resume"}},
		{"json", []string{"{", `"version": "v0.2.0",`}},
		{"yaml", []string{"api_versions:", "- crust.v1", "features:", "- raw-block"}},
	} {
		var buf bytes.Buffer
		if err := (&globals{output: tc.output}).print(&buf, "table", r, func(t *table) { infoRows(t, r) }); err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		for i, w := range tc.want {
			if i >= len(lines) || strings.Join(strings.Fields(lines[i]), " ") != w {
				t.Errorf("-o %q: %q, want line %d %q", tc.output, buf.String(), i, w)
				break
			}
		}
	}
}
