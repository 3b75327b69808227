package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A claimed volume is counted once, under claimed, so that sum(crust_volumes) is the number held.
func TestVolumeGaugesCountEachVolumeOnce(t *testing.T) {
	m := New()
	m.VolumeGauges(func() (held, claimed int) { return 5, 2 })
	want := `
# HELP crust_volumes Descriptors held, by state: staged (no sandbox claims it) or claimed; each is counted once.
# TYPE crust_volumes gauge
crust_volumes{state="claimed"} 2
crust_volumes{state="staged"} 3
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), "crust_volumes"); err != nil {
		t.Fatal(err)
	}
}
