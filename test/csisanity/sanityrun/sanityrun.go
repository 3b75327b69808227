// Package sanityrun runs csi-sanity (kubernetes-csi/csi-test, pinned in tools/csisanity) as a subprocess
// with `go tool` and reads its JUnit report into one result per test. The csisanity and csiproxy tests
// share it.
package sanityrun

import (
	"encoding/xml"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Pending is the message a spec csi-sanity marks pending gets as its skip reason.
const Pending = "pending in csi-sanity"

// Status is a test's outcome.
type Status int

// The outcomes of a test.
const (
	Passed Status = iota
	Failed
	Skipped
)

// Result is one csi-sanity test: its name, its status and, for a failure, the failure, for a skip, the
// reason csi-sanity gives (Pending for a pending spec).
type Result struct {
	Name    string
	Status  Status
	Message string
}

// Config is one run of csi-sanity.
type Config struct {
	ModuleRoot         string // the crust module's root, where the command runs
	Endpoint           string // a unix socket path
	ControllerEndpoint string // a unix socket path; empty for Endpoint
	StagingDir         string
	MountDir           string
	VolumeSize         int
	ExpandSize         int
	AccessType         string // "mount" or "block"; empty for csi-sanity's default
	ParametersFile     string // a YAML file of volume parameters; empty for none
	JUnit              string // where csi-sanity writes its JUnit report
}

// Report is what a run of csi-sanity left: its results in the report's order, its combined output, its
// exit error and how long it ran.
type Report struct {
	Results []Result
	Output  []byte
	RunErr  error
	Elapsed time.Duration
}

func command(root string, args ...string) *exec.Cmd {
	cmd := exec.Command("go", append([]string{"tool", "-modfile=" + filepath.Join(root, "tools", "csisanity", "go.mod"), "csi-sanity"}, args...)...)
	cmd.Dir = root
	// -modfile names the tool's own module, which workspace mode (the repository's go.work) refuses.
	cmd.Env = append(os.Environ(), "GOWORK=off")
	return cmd
}

// Build builds csi-sanity, so that the build does not count in a run's time; `go tool` caches it.
func Build(root string) error {
	if out, _ := command(root, "-h").CombinedOutput(); !strings.Contains(string(out), "csi.endpoint") {
		return fmt.Errorf("build csi-sanity:\n%s", out)
	}
	return nil
}

// Run runs csi-sanity as c says and reads its JUnit report. The report is returned even when reading the
// JUnit report fails (the error), for its output and exit error.
func Run(c Config) (*Report, error) {
	if c.JUnit == "" {
		return nil, errors.New("csi-sanity: no JUnit report path")
	}
	args := []string{"--csi.endpoint", "unix://" + c.Endpoint}
	if c.ControllerEndpoint != "" {
		args = append(args, "--csi.controllerendpoint", "unix://"+c.ControllerEndpoint)
	}
	args = append(args,
		"--csi.stagingdir", c.StagingDir,
		"--csi.mountdir", c.MountDir,
		"--csi.testvolumesize", strconv.Itoa(c.VolumeSize),
		"--csi.testvolumeexpandsize", strconv.Itoa(c.ExpandSize),
	)
	if c.AccessType != "" {
		args = append(args, "--csi.testvolumeaccesstype", c.AccessType)
	}
	if c.ParametersFile != "" {
		args = append(args, "--csi.testvolumeparameters", c.ParametersFile)
	}
	args = append(args, "--ginkgo.junit-report", c.JUnit, "--ginkgo.no-color", "--ginkgo.timeout", "20m")
	cmd := command(c.ModuleRoot, args...)
	r := &Report{}
	start := time.Now()
	r.Output, r.RunErr = cmd.CombinedOutput()
	r.Elapsed = time.Since(start)
	var err error
	r.Results, err = ReadJUnit(c.JUnit)
	return r, err
}

// Split returns the results that passed, failed and were skipped, each in the report's order.
func Split(results []Result) (passed, failed, skipped []Result) {
	for _, r := range results {
		switch r.Status {
		case Passed:
			passed = append(passed, r)
		case Failed:
			failed = append(failed, r)
		case Skipped:
			skipped = append(skipped, r)
		}
	}
	return passed, failed, skipped
}

// Outcomes maps each test's name to "passed", "failed" or "skipped: <reason>", for comparing runs test by
// test.
func Outcomes(results []Result) map[string]string {
	o := make(map[string]string, len(results))
	for _, r := range results {
		switch r.Status {
		case Passed:
			o[r.Name] = "passed"
		case Failed:
			o[r.Name] = "failed"
		case Skipped:
			o[r.Name] = "skipped: " + strings.TrimSpace(r.Message)
		}
	}
	return o
}

// ReadJUnit reads ginkgo's JUnit report: the spec test cases as passed, failed (with the failure) and
// skipped (with the reason). Suite set-up and tear-down count only when they fail.
func ReadJUnit(path string) ([]Result, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var suites struct {
		Suites []struct {
			Cases []struct {
				Name    string `xml:"name,attr"`
				Status  string `xml:"status,attr"`
				Skipped *struct {
					Message string `xml:"message,attr"`
				} `xml:"skipped"`
				Failure *struct {
					Message string `xml:"message,attr"`
					Text    string `xml:",chardata"`
				} `xml:"failure"`
				Error *struct {
					Message string `xml:"message,attr"`
					Text    string `xml:",chardata"`
				} `xml:"error"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(b, &suites); err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	var res []Result
	for _, s := range suites.Suites {
		for _, c := range s.Cases {
			if strings.Contains(c.Name, "BeforeSuite]") || strings.Contains(c.Name, "AfterSuite]") {
				if c.Failure != nil || c.Error != nil {
					res = append(res, Result{c.Name, Failed, "suite set-up or tear-down failed"})
				}
				continue
			}
			switch {
			case c.Failure != nil:
				res = append(res, Result{c.Name, Failed, c.Failure.Message + "\n" + c.Failure.Text})
			case c.Error != nil:
				res = append(res, Result{c.Name, Failed, c.Error.Message + "\n" + c.Error.Text})
			case c.Status == "pending":
				res = append(res, Result{c.Name, Skipped, Pending})
			case c.Skipped != nil || c.Status == "skipped":
				msg := ""
				if c.Skipped != nil {
					msg = c.Skipped.Message
				}
				res = append(res, Result{c.Name, Skipped, msg})
			default:
				res = append(res, Result{c.Name, Passed, ""})
			}
		}
	}
	return res, nil
}

// Tail returns the last lines of b.
func Tail(b []byte, lines int) string {
	l := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}
