package client_test

import (
	"slices"
	"testing"

	"crust.dev/crust/api/crustd"
)

// TestInfo: a driver asks crustd what it speaks before it relies on a feature.
func TestInfo(t *testing.T) {
	info, err := newClient(t).Info(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(info.GetFeatures(), crustd.FeatureRawBlock) || !slices.Equal(info.GetApiVersions(), []string{"crust.v1"}) {
		t.Errorf("info %v: want crust.v1 and %q", info, crustd.FeatureRawBlock)
	}
}
