package csiproxy

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"crust.dev/crust/internal/validate"
	crustv1 "crust.dev/crust/pkg/api/crust/v1"
	"crust.dev/crust/pkg/client"
)

// checkIOLimits reads the I/O limit keys of a volume context or StorageClass parameters (client.IOLimits)
// and checks them as crustd will (validate.IOLimits), so that a bad value is refused with
// InvalidArgument naming the parameter before the proxy or the driver does anything. Nil means no limit.
func checkIOLimits(params map[string]string) (*crustv1.IOLimits, error) {
	l, err := client.IOLimits(params)
	if err != nil {
		return nil, err
	}
	if err := validate.IOLimits(l, client.IOLimitKey); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return l, nil
}
