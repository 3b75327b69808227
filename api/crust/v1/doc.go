// Package crustv1 is the Go of crust's API, generated from api/proto/crust/v1/crust.proto: VolumeService
// (called by CSI node plugins and crust-csi-proxy), RuntimeService (called by runtime handlers) and
// RuntimeHandlerService (served by a runtime handler, called by crustd). Most callers use it through
// crust.dev/crust/api/client (CSI side) or crust.dev/crust/api/handler (runtime side).
package crustv1
