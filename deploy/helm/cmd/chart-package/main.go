// Command chart-package is `helm package` for `make release`, with Helm's own Go code (chartutil.Save,
// the library `helm package` calls), so that the release needs no helm binary:
//
//	go run ./cmd/chart-package -out DIR -version V CHART_DIR
//
// It loads the chart directory (honouring its .helmignore), refuses it unless its version is V (the
// file VERSION without its leading v), and writes DIR/NAME-VERSION.tgz, printing that path.
package main

import (
	"flag"
	"fmt"
	"os"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
)

func main() {
	out := flag.String("out", ".", "directory to write the packaged chart to")
	version := flag.String("version", "", "the version the chart must have (required)")
	flag.Parse()
	if flag.NArg() != 1 || *version == "" {
		fmt.Fprintln(os.Stderr, "usage: chart-package -out DIR -version V CHART_DIR")
		os.Exit(2)
	}
	path, err := pack(flag.Arg(0), *out, *version)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chart-package:", err)
		os.Exit(1)
	}
	fmt.Println(path)
}

// pack packages the chart in dir into out, refusing it unless its version is version, and returns the
// package's path.
func pack(dir, out, version string) (string, error) {
	c, err := loader.LoadDir(dir)
	if err != nil {
		return "", err
	}
	if got := c.Metadata.Version; got != version {
		return "", fmt.Errorf("%s: Chart.yaml version is %q, want %q", dir, got, version)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return "", err
	}
	return chartutil.Save(c, out)
}
