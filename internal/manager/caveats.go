package manager

import (
	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/pkg/api/crust/v1"
)

// kataCaveats says, one sentence each, what an unmodified Kata runtime cannot honour of v's descriptor
// when it takes the volume from the Kata projection; nil when Kata takes it as crust's handlers do.
func kataCaveats(v *crustv1.Volume) []string {
	var out []string
	if v.GetSpec().GetIoLimits() != nil {
		out = append(out, "Kata ignores the I/O limits: its mountInfo.json has no place for them, so an unmodified Kata "+
			"runtime attaches the device without throttling.")
	}
	return out
}

// withKataCaveats returns v with its Kata caveats (kataCaveats), as answers carry them: a copy when there
// are any, v itself otherwise. Caveats are computed for answers, never stored.
func withKataCaveats(v *crustv1.Volume) *crustv1.Volume {
	cv := kataCaveats(v)
	if len(cv) == 0 {
		return v
	}
	c := proto.CloneOf(v)
	c.KataCaveats = cv
	return c
}
