// Package kata reads and writes Kata Containers' "direct-assigned volume" files, the format an unmodified
// Kata runtime reads to mount a block device inside its VM instead of on the host. It depends on nothing
// else of crust.
//
// The layout, under a directory that defaults to DefaultDir:
//
//	<dir>/<VolumeDirName(volumePath)>/            mode 0700, one per volume
//	<dir>/<VolumeDirName(volumePath)>/mountInfo.json   mode 0600, a MountInfo as JSON
//	<dir>/<VolumeDirName(volumePath)>/<sandbox id>     empty, written by the Kata shim that uses the volume
//
// Kata reads every entry of a volume directory other than mountInfo.json as a sandbox id. So this package
// never puts anything else there: it prepares files and directories in TempDirName, a dot-directory of
// dir (on the same filesystem, and never a valid volume directory name) and renames them into place.
//
// The directory may be reached by others (Kata's shims, other drivers' `kata-runtime direct-volume add`),
// so it is treated as hostile: Dir opens it once, refuses it when another user owns it or may write in
// it, and does every operation relative to it without following a symbolic link (crust.dev/crust/api/safedir).
// An entry that is not what the layout above puts at its place is ErrForeignEntry and is never written,
// read or removed through. The package functions (Add, Get, ...) open the directory for one call.
//
// Add, Remove, Get and SandboxIDs behave like `kata-runtime direct-volume` and Kata's runtime on the same
// files, with two differences that only make them safer: writes are atomic and durable (Kata writes in
// place; a Dir opened WithoutSync keeps them atomic only, for a writer that rebuilds the directory after
// a crash), and input is checked before anything is created (Kata creates the volume directory first).
//
// ShimClient speaks the other half of the format: the direct-volume part of a Kata shim's management API
// (HTTP over a unix socket per sandbox), to ask the sandbox that uses a volume for its stats or to resize
// it, as `kata-runtime direct-volume stats|resize` do. The sandbox is the first of SandboxIDs; the device
// named in the requests is the MountInfo's Device, the host path, not the volume path.
package kata
