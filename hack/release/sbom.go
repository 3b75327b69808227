package main

import (
	"crypto/sha256"
	"fmt"
	"maps"
	"runtime/debug"
	"slices"
)

// The CycloneDX 1.5 JSON document, as far as the SBOM uses it.
type (
	bom struct {
		BOMFormat    string       `json:"bomFormat"`
		SpecVersion  string       `json:"specVersion"`
		SerialNumber string       `json:"serialNumber"`
		Version      int          `json:"version"`
		Metadata     bomMetadata  `json:"metadata"`
		Components   []component  `json:"components"`
		Dependencies []dependency `json:"dependencies"`
	}
	bomMetadata struct {
		Component component `json:"component"`
	}
	component struct {
		Type       string     `json:"type"`
		BOMRef     string     `json:"bom-ref"`
		Name       string     `json:"name"`
		Version    string     `json:"version,omitempty"`
		PURL       string     `json:"purl,omitempty"`
		Properties []property `json:"properties,omitempty"`
	}
	property struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	}
	dependency struct {
		Ref       string   `json:"ref"`
		DependsOn []string `json:"dependsOn"`
	}
)

// cycloneDX returns the SBOM of crust at version: the release as its subject; a container component
// per image and platform, depending on its programs and packages; an application component per
// program and platform (its image, platform, path in the image and Go toolchain as properties),
// depending on the Go modules it links; a library component per Go module by its package URL
// (pkg:golang/PATH@VERSION, a replaced module by its replacement), and per Debian package that an
// image's files come from, as debs says by platform and path (pkg:deb/debian/NAME@VERSION?arch=ARCH). The serial number is derived from
// the content, so that the same images give the same document.
func cycloneDX(version string, images []imageContent, debs map[string]map[string]deb) bom {
	doc := bom{
		BOMFormat: "CycloneDX", SpecVersion: "1.5", Version: 1,
		Metadata: bomMetadata{Component: component{Type: "application", BOMRef: "crust@" + version, Name: "crust", Version: version}},
	}
	libs := map[string]component{}
	for _, img := range images {
		imgRef := img.image + "#" + img.platform
		imgDep := dependency{Ref: imgRef, DependsOn: []string{}}
		doc.Components = append(doc.Components, component{
			Type: "container", BOMRef: imgRef, Name: img.image, Version: version,
			Properties: []property{{"crust:platform", img.platform}},
		})
		for _, p := range img.programs {
			ref := imgRef + ":" + p.path
			doc.Components = append(doc.Components, component{
				Type: "application", BOMRef: ref, Name: p.info.Path, Version: version,
				Properties: []property{
					{"crust:image", p.image}, {"crust:platform", p.platform}, {"crust:path", p.path}, {"crust:go", p.info.GoVersion},
				},
			})
			dep := dependency{Ref: ref, DependsOn: []string{}}
			for _, m := range p.info.Deps {
				if m.Replace != nil {
					m = m.Replace
				}
				purl := goPURL(m)
				libs[purl] = component{Type: "library", BOMRef: purl, Name: m.Path, Version: m.Version, PURL: purl}
				dep.DependsOn = append(dep.DependsOn, purl)
			}
			slices.Sort(dep.DependsOn)
			doc.Dependencies = append(doc.Dependencies, dep)
			imgDep.DependsOn = append(imgDep.DependsOn, ref)
		}
		for _, f := range img.files {
			d, ok := debs[img.platform][f]
			if !ok {
				continue
			}
			purl := "pkg:deb/debian/" + d.name + "@" + d.version + "?arch=" + d.arch
			libs[purl] = component{Type: "library", BOMRef: purl, Name: d.name, Version: d.version, PURL: purl}
			imgDep.DependsOn = append(imgDep.DependsOn, purl)
		}
		imgDep.DependsOn = slices.Compact(slices.Sorted(slices.Values(imgDep.DependsOn)))
		doc.Dependencies = append(doc.Dependencies, imgDep)
	}
	for _, purl := range slices.Sorted(maps.Keys(libs)) {
		doc.Components = append(doc.Components, libs[purl])
	}
	h := sha256.New()
	for _, c := range doc.Components {
		fmt.Fprintln(h, c.BOMRef)
	}
	sum := h.Sum(nil)
	sum[6] = sum[6]&0x0f | 0x50 // a name-based UUID (version 5 layout, SHA-based)
	sum[8] = sum[8]&0x3f | 0x80
	doc.SerialNumber = fmt.Sprintf("urn:uuid:%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
	return doc
}

// goPURL is the package URL of the Go module m.
func goPURL(m *debug.Module) string {
	return "pkg:golang/" + m.Path + "@" + m.Version
}
