package daemon

import (
	"slices"
	"testing"

	"github.com/fsnotify/fsnotify"
)

func TestPodsGone(t *testing.T) {
	const pods = "/var/lib/kubelet/pods"
	gone := func(name string) fsnotify.Event { return fsnotify.Event{Name: name, Op: fsnotify.Remove} }
	for _, tc := range []struct {
		name   string
		events []fsnotify.Event
		want   []string // nil: every pod
	}{
		{"a tick: every pod", nil, nil},
		{"pod directories gone", []fsnotify.Event{gone(pods + "/uid-a"), gone(pods + "/uid-b")}, []string{"uid-a", "uid-b"}},
		{"the pods directory itself gone: every pod", []fsnotify.Event{gone(pods + "/uid-a"), gone(pods)}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := podsGone(pods, tc.events); !slices.Equal(got, tc.want) || (got == nil) != (tc.want == nil) {
				t.Fatalf("podsGone = %q, want %q", got, tc.want)
			}
		})
	}
}
