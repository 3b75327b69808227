// Package client is what a CSI node plugin imports to defer the filesystem work of a volume to the
// microVM runtime that runs the pod, through crustd. It depends on crust's API, grpc and the CSI spec's
// Go types only, never on crustd's insides.
//
// Deferral is a few lines in four CSI calls:
//
//	crust, err := client.New(crustd.SocketFromEnv(), client.WithDriverName("lvm.example.com"))
//
//	// NodePublishVolume: a mount volume whose StorageClass says crust.dev/defer: "true".
//	if volume.Deferred(req.GetVolumeContext()) && req.GetVolumeCapability().GetMount() != nil {
//		_ = os.MkdirAll(req.GetTargetPath(), 0o750) // kubelet expects the target directory
//		return crust.Publish(ctx, req, "/dev/vg0/"+req.GetVolumeId(), client.CreateFilesystem())
//	}
//
//	// NodeUnpublishVolume, NodeGetVolumeStats, NodeExpandVolume: requests carry no volume context,
//	// so ask crustd whether it holds the path.
//	if held, err := crust.Holds(ctx, req.GetTargetPath()); err != nil || held {
//		... return crust.Unpublish(ctx, req) (Stats, Expand alike), or the error
//	}
//
// A deferring StorageClass may also serve pods that run on the host: Deferral decides per pod, from the
// runtime handler of its RuntimeClass, whether a publish is deferred or formatted and mounted on the host
// by the driver (whose stage skipped that).
//
// A raw block volume (a block capability) is left to the runtime, which takes the device kubelet maps;
// a driver that wants crust's handlers to attach it anyway publishes it as CSI asks and deposits it
// with the RawBlock option (Publish(ctx, req, dev, client.RawBlock())).
//
// Every method returns errors of crust.dev/crust/api/errdefs' kinds, each carrying the gRPC status whose
// code is CSI's, so a driver returns them as they are (with or without errdefs' server interceptors):
// InvalidArgument for a missing or bad field (the message names it; errors.As finds an
// *errdefs.FieldError), AlreadyExists for a target published with other parameters, NotFound (no deferred
// volume of that id at that path), FailedPrecondition (a device smaller than the size asked, or no longer
// the one published, or mounted on the host), Aborted (another call on the same target is in flight),
// Unavailable (crustd or the runtime handler cannot be reached), PermissionDenied (the driver's uid is not
// allowed by crustd). Test them with errors.Is.
package client
