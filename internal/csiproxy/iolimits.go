package csiproxy

import (
	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/volume"
)

// checkIOLimits reads and checks the I/O limit keys of a volume context or StorageClass parameters as
// crustd will (volume.ParseIOLimits), so that a bad value is refused with InvalidArgument naming the
// parameter before the proxy or the driver does anything. Nil means no limit.
func checkIOLimits(params map[string]string) (*crustv1.IOLimits, error) {
	return volume.ParseIOLimits(params)
}
