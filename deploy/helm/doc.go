// Package helm holds no code: its tests keep crust's Helm chart (crust/) and its post-renderer
// (csi-proxy-post-renderer.sh) equal to the kustomize tree in deploy/, which is their source. It is a Go
// module of its own so that Helm's and kustomize's dependencies stay out of crust's module, which drivers
// import (api/client).
package helm
