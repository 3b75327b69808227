// Package volume is crust's vocabulary for the facts about a volume that a CSI driver, crustd, the CSI
// proxy and a runtime handler must agree on: which filesystem types a descriptor may name, the keys of
// descriptor metadata and of StorageClass parameters, which keys hold secrets and how they are kept out
// of answers and logs, the rules for I/O limits, what a kubelet path says about its pod and volume, and
// how large an ext or XFS filesystem says it is (FilesystemBytes, which tells whether it fills a grown
// disk).
//
// Each fact is written here once; every component reads it from here, so they cannot disagree. The
// package does nothing on its own: no state, and no I/O but FilesystemBytes' read of a superblock. It depends on the API's Go types, on errdefs for its
// refusals (each a *errdefs.FieldError naming the field or key) and on nothing else of crust.
package volume
