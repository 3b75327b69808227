package forward

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/kata"
	"crust.dev/crust/internal/katadir"
)

// kataStats asks the Kata shim of v's sandbox for the stats of v's device.
func (f *Forwarder) kataStats(ctx context.Context, v *crustv1.Volume) (*crustv1.GetVolumeStatsResponse, error) {
	c := &kata.ShimClient{Dirs: f.KataShimDirs}
	st, err := c.Stats(ctx, v.GetClaim().GetSandboxId(), kataDevice(v))
	if err != nil {
		return nil, kataError(v, err)
	}
	r := &crustv1.GetVolumeStatsResponse{}
	for _, u := range st.Usage {
		r.Usage = append(r.Usage, &crustv1.VolumeUsage{
			Available: clamp(u.Available), Total: clamp(u.Total), Used: clamp(u.Used), Unit: unit(u.Unit),
		})
	}
	if c := st.VolumeCondition; c != nil {
		r.VolumeCondition = &crustv1.VolumeCondition{Abnormal: c.Abnormal, Message: c.Message}
	}
	return r, nil
}

// kataExpand asks the Kata shim of v's sandbox to resize v's device to requiredBytes, and answers
// requiredBytes on success: Kata reports no capacity.
func (f *Forwarder) kataExpand(ctx context.Context, v *crustv1.Volume, requiredBytes int64) (int64, error) {
	if requiredBytes <= 0 {
		return 0, errdefs.Field("required_bytes", "must be positive, got %d", requiredBytes)
	}
	c := &kata.ShimClient{Dirs: f.KataShimDirs}
	if err := c.Resize(ctx, v.GetClaim().GetSandboxId(), kataDevice(v), uint64(requiredBytes)); err != nil {
		return 0, kataError(v, err)
	}
	return requiredBytes, nil
}

// kataDevice is how a Kata shim knows v's device: the device of its mountInfo.json.
func kataDevice(v *crustv1.Volume) string {
	return katadir.MountInfo(v).Device
}

// kataError gives a shim client's error its kind (see the package documentation), keeping its text.
func kataError(v *crustv1.Volume, err error) error {
	prefix := fmt.Sprintf("volume %q", v.GetSpec().GetVolumeTargetPath())
	var se *kata.ShimError
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return fmt.Errorf("%s: %w", prefix, err)
	case errors.Is(err, kata.ErrShimUnreachable):
		return fmt.Errorf("%s: %w: %w", prefix, err, errdefs.ErrUnavailable)
	case errors.Is(err, kata.ErrInvalidSandboxID):
		return fmt.Errorf("%s: %w: %w", prefix, err, errdefs.ErrFailedPrecondition)
	case errors.As(err, &se):
		switch {
		case se.Status == http.StatusBadRequest:
			return fmt.Errorf("%s: %w: %w", prefix, err, errdefs.ErrInvalidArgument)
		case se.Status == http.StatusNotImplemented, se.Status == http.StatusNotFound,
			se.Status == http.StatusMethodNotAllowed, se.Status == http.StatusInternalServerError && saysUnimplemented(se.Body):
			return fmt.Errorf("%s: %w: %w", prefix, err, errdefs.ErrUnimplemented)
		}
	}
	return fmt.Errorf("%s: %w", prefix, err)
}

// saysUnimplemented reports whether a shim's error text says the operation is not implemented, as the
// UNIMPLEMENTED status a Kata guest agent returns reads once the shim passes it on.
func saysUnimplemented(text string) bool {
	t := strings.ToLower(text)
	return strings.Contains(t, "unimplemented") || strings.Contains(t, "not implemented")
}

// clamp turns Kata's unsigned numbers into the API's signed ones; none is that large in practice.
func clamp(n uint64) int64 {
	if n > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(n)
}

// unit maps Kata's usage unit to the API's; the numbers agree, and an unknown one is unspecified.
func unit(u kata.UsageUnit) crustv1.VolumeUsage_Unit {
	switch u {
	case kata.UsageUnitBytes:
		return crustv1.VolumeUsage_UNIT_BYTES
	case kata.UsageUnitInodes:
		return crustv1.VolumeUsage_UNIT_INODES
	}
	return crustv1.VolumeUsage_UNIT_UNSPECIFIED
}
